"""Probe backends behind one interface (base.py): sim (the analytic model), torch (a GRPO-shaped PyTorch
workload) and verl (verl's main_ppo as a subprocess), with process supervision and GPU sampling."""
