"""autotune: find the fastest way to run a verl GRPO training job.

Public API (small on purpose): the CLI (`autotune.cli.main`), the model and GPU tables, and the pieces a
script may compose: SearchSpace, check (verl's rules), estimate_memory / estimate_step_time (the
calibrated model) and run_study. Heavy backends (torch, verl) import lazily.
"""

__version__ = "0.1.0"
