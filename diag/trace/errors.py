"""The one error type for unreadable input: it always names the file and the problem."""
from __future__ import annotations


class TraceError(Exception):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem
