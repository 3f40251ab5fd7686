"""`python -m diag ...`: the same as the `diag` command."""
from .cli import run

run()
