"""The analytic model: memory, step time, FLOPs, host memory and their calibration. Pure arithmetic; imports
nothing above it (tests/test_layering.py)."""
