"""Everything autotune knows about verl 0.9.1, in one place (docs/architecture.md says which fact lives where).

Importing this package imports neither verl nor torch: verl is read only by tests, benchmarks and the
verl probe backend, lazily.
"""
