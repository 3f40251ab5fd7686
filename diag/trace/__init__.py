"""Kineto JSON(.gz) traces -> columnar per-rank event tables (see table.py)."""
from .errors import TraceError
from .job import Job, load_job, load_rank
from .kinds import Coll, Kind
from .table import CommTable, EventTable, RankTrace

__all__ = ["Coll", "CommTable", "EventTable", "Job", "Kind", "RankTrace", "TraceError", "load_job", "load_rank"]
