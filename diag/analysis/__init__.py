"""Pure analyses: event tables in, typed results out (see results.py)."""
from .diagnose import analyse_rank, diagnose
from .results import Diagnosis

__all__ = ["Diagnosis", "analyse_rank", "diagnose"]
