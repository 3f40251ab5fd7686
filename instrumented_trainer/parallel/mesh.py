"""The job's DeviceMesh, built from the layout model (diag.layout), and this rank's place in it.

One `init_device_mesh` call over the layout's axes, outermost first as Megatron-LM and torchtitan
order them (pipeline outermost, tensor-parallel innermost: `rank = tp + tp_size * (dp + dp_size *
pp)`), so diag's rank arithmetic and torch's agree. Every process group the job uses is a mesh
dimension's group, named `mesh_<axis>` in the traces' `pg_config`, which is how diag finds the
layout and each collective's axis in a trace that carries nothing else.

Every dimension's groups get the job's `--dist-timeout`: a sub-group created without one takes
c10d's default (30 minutes on gloo), not the default group's, so a stuck TP or PP collective
would outlive the timeout the job was given. `init_device_mesh` passes a timeout on only through
a backend override's options (`Options._timeout`), so every dimension gets one; it also gives
a dimension spanning the whole job its own group instead of the default one, named
`mesh_<axis>` in the traces (the default group is `default_pg`: its axis would be lost).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from diag.layout import RANK_ORDER, Coords, Layout

# The axes the trainer runs, outermost first in the layout model's rank order; every one is a
# mesh dimension, of size 1 if unused, so code can always ask for mesh["tp"].
TRAINER_AXES = ("tp", "dp_shard", "dp", "pp")
MESH_AXES = tuple(a for a in reversed(RANK_ORDER.split("-")) if a in TRAINER_AXES)


def group_options(backend: str, timeout: datetime.timedelta):
    """Backend options carrying `timeout` (NCCL's own options class, else c10d's generic one)."""
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return options
    return C10dBackend.Options(backend, timeout)


def group_timeout(group) -> datetime.timedelta:
    """The timeout a process group's backend was created with (the c10d backend's options)."""
    device = torch.device("cuda" if dist.get_backend(group) == "nccl" else "cpu")
    return group._get_backend(device).options._timeout


@dataclass
class JobMesh:
    """The mesh, the layout it was built from, and this rank's coordinates."""

    mesh: DeviceMesh
    layout: Layout
    rank: int

    @classmethod
    def build(cls, layout: Layout, device_type: str, timeout_s: float) -> "JobMesh":
        sizes = tuple(layout.size(a) for a in MESH_AXES)
        backend = dist.get_backend()
        options = group_options(backend, datetime.timedelta(seconds=timeout_s))
        mesh = init_device_mesh(device_type, sizes, mesh_dim_names=MESH_AXES,
                                backend_override={a: (backend, options) for a in MESH_AXES})
        return cls(mesh, layout, dist.get_rank())

    @property
    def coords(self) -> Coords:
        return self.layout.coords(self.rank)

    def size(self, axis: str) -> int:
        return self.layout.size(axis)

    def __getitem__(self, axis: str) -> DeviceMesh:
        return self.mesh[axis]

    def group(self, axis: str):
        return self.mesh[axis].get_group()

    @property
    def dp_mesh(self) -> DeviceMesh:
        """The mesh FSDP2 shards over: `dp_shard`, or (`dp`, `dp_shard`) for HSDP."""
        return self.mesh["dp", "dp_shard"] if self.size("dp") > 1 else self.mesh["dp_shard"]

    @property
    def dp_rank(self) -> int:
        """Index among all data-parallel ranks (replicas outer, shards inner)."""
        c = self.coords
        return c["dp"] * self.size("dp_shard") + c["dp_shard"]

    @property
    def dp_size(self) -> int:
        return self.size("dp") * self.size("dp_shard")

    def axis_groups(self) -> dict[str, tuple[str, list[int]]]:
        """Process-group name -> (axis, member ranks), for labelling collectives by axis."""
        out = {}
        for axis in MESH_AXES:
            g = self.group(axis)
            out[g.group_name] = (axis, dist.get_process_group_ranks(g))
        return out
