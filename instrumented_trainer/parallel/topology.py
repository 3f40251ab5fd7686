"""torch.distributed process groups for the TP, PP and DP axes, derived from one RankGrid.

`diag.layout.RankGrid` says which ranks form each group; this module turns that into process
groups and gives the rest of the trainer one object to communicate through, by axis name, so no
layer or schedule ever handles a raw group or bypasses the instrumented `CommLog`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from diag.layout import Axis, Coords, RankGrid
from instrumented_trainer.telemetry.comm import CommLog


@dataclass
class AxisGroup:
    """This rank's group along one axis."""

    axis: Axis
    ranks: list[int]
    handle: object  # a ProcessGroup

    @property
    def size(self) -> int:
        return len(self.ranks)


class ParallelGroups:
    """This rank's place in the grid, its three groups, and the instrumented collectives."""

    def __init__(self, grid: RankGrid, rank: int, comm: CommLog) -> None:
        self.grid, self.rank, self.comm = grid, rank, comm
        self.coords: Coords = grid.coords(rank)
        self._groups: dict[Axis, AxisGroup] = {}
        # Every rank must call new_group for every group, in the same order, even for groups it
        # is not in: group creation is itself a collective over the default group.
        for axis in (Axis.TP, Axis.DP, Axis.PP):
            for ranks in grid.groups(axis):
                handle = dist.new_group(ranks=ranks, group_desc=str(axis))  # pg_desc in traces
                if rank in ranks:
                    self._groups[axis] = AxisGroup(axis, ranks, handle)

    def group(self, axis: Axis) -> AxisGroup:
        return self._groups[axis]

    def size(self, axis: Axis) -> int:
        return self.grid.size(axis)

    def local_rank(self, axis: Axis) -> int:
        return {Axis.TP: self.coords.tp_rank, Axis.PP: self.coords.pp_rank,
                Axis.DP: self.coords.dp_rank}[axis]

    @property
    def is_first_stage(self) -> bool:
        return self.coords.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords.pp_rank == self.grid.pp - 1

    # -- instrumented communication, by axis ------------------------------------------------
    def all_reduce(self, tensor, axis: Axis, op: str = "sum", async_op: bool = False):
        """All-reduce in place along `axis`; a no-op (returns None) on a group of one."""
        g = self._groups[axis]
        if g.size == 1:
            return None
        return self.comm.all_reduce(tensor, axis, g.handle, g.ranks, op=op, async_op=async_op)

    def stage_peer(self, offset: int) -> int:
        """Global rank of the pipeline stage `offset` away (+1 next, -1 previous)."""
        c = self.coords
        return self.grid.rank(c.tp_rank, c.pp_rank + offset, c.dp_rank)

    def isend(self, tensor, dst: int):
        g = self._groups[Axis.PP]
        return self.comm.isend(tensor, dst, Axis.PP, g.handle, g.ranks)

    def irecv(self, tensor, src: int):
        g = self._groups[Axis.PP]
        return self.comm.irecv(tensor, src, Axis.PP, g.handle, g.ranks)
