"""The torch backend: runner.py launches workload.py in a subprocess (torchrun when GPUs > 1)."""
