"""Kineto JSON(.gz) traces -> columnar per-rank event tables (see table.py).

The names below are imported on first use (PEP 562): `diag.trace.errors`, which every command
imports, must not pull in numpy and the decoder before the command has read its first byte.
"""
from importlib import import_module

_WHERE = {"TraceError": "errors", "Job": "job", "load_job": "job", "load_rank": "job",
          "Coll": "kinds", "Kind": "kinds", "CommTable": "table", "EventTable": "table",
          "RankTrace": "table"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
