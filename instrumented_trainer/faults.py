"""Faults injected on purpose, to prove that a hang or a slow rank is found from what the run left.

`--fault-stall RANK:STEP:SECONDS`: rank RANK sleeps SECONDS once, before step STEP (longer than
--dist-timeout: the others time out in a collective it never entered, a hang).
`--fault-slow RANK:STEP:SECONDS`: rank RANK sleeps SECONDS before every step from STEP on (a rank
that got slow an hour in). Off unless given; they change no computed value.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    seconds: float

    @classmethod
    def parse(cls, spec: str, flag: str) -> Optional["Fault"]:
        """'1:5:0.3' -> Fault(1, 5, 0.3); '' -> None; ValueError naming the flag otherwise."""
        if not spec:
            return None
        parts = spec.split(":")
        try:
            rank, step, seconds = int(parts[0]), int(parts[1]), float(parts[2])
        except (ValueError, IndexError):
            raise ValueError(f"{flag} wants RANK:STEP:SECONDS, got {spec!r}") from None
        if len(parts) != 3 or rank < 0 or step < 0 or not seconds > 0:
            raise ValueError(f"{flag} wants RANK:STEP:SECONDS with rank, step >= 0 and seconds > 0, got {spec!r}")
        return cls(rank, step, seconds)


def before_step(step: int, stall: Optional[Fault], slow: Optional[Fault]) -> None:
    """Sleep where a fault says this rank sleeps before `step`."""
    rank = int(os.environ.get("RANK", 0))
    for f, every in ((stall, False), (slow, True)):
        if f is not None and f.rank == rank and (step >= f.step if every else step == f.step):
            time.sleep(f.seconds)
