"""The 3D-parallel rank grid as plain data.

Both the trainer (to build its process groups) and the analyser (to place a trace's rank in the
grid) need the same answer to "which (tp, pp, dp) coordinates does global rank r have, and who
else is in its tensor/pipeline/data-parallel group?". This module answers it without torch, so
the analyser can use it on a machine that has no torch installed.

Rank order follows Megatron-LM: tensor-parallel innermost, then data-parallel, then pipeline:

    rank = tp_rank + tp * (dp_rank + dp * pp_rank)

so the ranks of one TP group are consecutive (they share a node and its fast links) and the
pipeline stages are the outermost, slowest-changing coordinate.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Axis(str, enum.Enum):
    """A parallel axis; the value is the short name used in trace labels and metrics."""

    TP = "tp"
    PP = "pp"
    DP = "dp"

    def __str__(self) -> str:  # f"{Axis.TP}" -> "tp" on every Python version
        return self.value


RANK_ORDER = "tp-dp-pp"  # innermost first; written to diag_run.json so readers need not assume it


@dataclass(frozen=True)
class Coords:
    """The position of one rank in the grid."""

    tp_rank: int
    pp_rank: int
    dp_rank: int

    def __iter__(self):  # lets callers unpack: tp, pp, dp = grid.coords(r)
        return iter((self.tp_rank, self.pp_rank, self.dp_rank))


@dataclass(frozen=True)
class RankGrid:
    """Sizes of the tensor-, pipeline- and data-parallel axes of one job."""

    tp: int
    pp: int
    dp: int

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RankGrid.{name} must be a positive integer, got {value!r}")

    @classmethod
    def from_world(cls, world_size: int, tp: int, pp: int) -> "RankGrid":
        """The grid of a job of `world_size` ranks; DP is what is left after TP and PP."""
        if world_size < 1 or tp < 1 or pp < 1 or world_size % (tp * pp):
            raise ValueError(
                f"world size {world_size} is not divisible by "
                f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp}"
            )
        return cls(tp=tp, pp=pp, dp=world_size // (tp * pp))

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def size(self, axis: Axis | str) -> int:
        return getattr(self, Axis(axis).value)

    def rank(self, tp_rank: int, pp_rank: int, dp_rank: int) -> int:
        """Global rank of the given coordinates."""
        for name, value, size in (("tp", tp_rank, self.tp), ("pp", pp_rank, self.pp),
                                  ("dp", dp_rank, self.dp)):
            if not 0 <= value < size:
                raise ValueError(f"{name}_rank {value} out of range [0, {size})")
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)

    def coords(self, rank: int) -> Coords:
        """(tp_rank, pp_rank, dp_rank) of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range [0, {self.world_size})")
        tp_rank = rank % self.tp
        dp_rank = (rank // self.tp) % self.dp
        pp_rank = rank // (self.tp * self.dp)
        return Coords(tp_rank=tp_rank, pp_rank=pp_rank, dp_rank=dp_rank)

    def groups(self, axis: Axis | str) -> list[list[int]]:
        """Every group along `axis`, each a sorted list of global ranks.

        The order of the outer list is deterministic (by the other two coordinates), which the
        trainer relies on: every rank must create the same groups in the same order.
        """
        axis = Axis(axis)
        groups: dict[tuple[int, int], list[int]] = {}
        for r in range(self.world_size):
            c = self.coords(r)
            key = {
                Axis.TP: (c.pp_rank, c.dp_rank),
                Axis.DP: (c.pp_rank, c.tp_rank),
                Axis.PP: (c.dp_rank, c.tp_rank),
            }[axis]
            groups.setdefault(key, []).append(r)
        return [groups[k] for k in sorted(groups)]

    def group_of(self, rank: int, axis: Axis | str) -> list[int]:
        """The group along `axis` that contains `rank` (sorted): O(group size), not O(world)."""
        axis = Axis(axis)
        c = self.coords(rank)
        if axis == Axis.TP:
            return [self.rank(t, c.pp_rank, c.dp_rank) for t in range(self.tp)]
        if axis == Axis.DP:
            return [self.rank(c.tp_rank, c.pp_rank, d) for d in range(self.dp)]
        return [self.rank(c.tp_rank, p, c.dp_rank) for p in range(self.pp)]

    def is_first_stage(self, rank: int) -> bool:
        return self.coords(rank).pp_rank == 0

    def is_last_stage(self, rank: int) -> bool:
        return self.coords(rank).pp_rank == self.pp - 1
