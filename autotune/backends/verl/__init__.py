"""The verl backend: runner.py launches verl main_ppo as a supervised subprocess."""
