"""`python -m autotune.verl.step_switch_entry`: autotune/verl/step_switch.py's main, with that module imported under
its own name. Run as `-m autotune.verl.step_switch` itself, its classes would be defined twice (as __main__ and, when
Ray unpickles them, as autotune.verl.step_switch) and verl's trainer registry refuses the second registration."""

from autotune.verl.step_switch import main

if __name__ == "__main__":
    main()
