"""`python -m diag ...`: the same as the `diag` command."""
from .entry import run

run()
