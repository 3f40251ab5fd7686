"""The parallel layout of a job as plain data: named axes, their sizes and the rank order.

Everyone who needs to answer "which coordinates does global rank r have, and who else is in its
tensor-/pipeline-/data-parallel group?" asks one object, like torchtitan's `ParallelDims` and a
`DeviceMesh`, but without torch: the trainer (to build its mesh), the analyser (to place a
trace's rank and name its process groups), the recommender, the exporter and the dashboards.
Adding an axis is a line in `AXES` (and, if frameworks spell it differently, in `DESC_AXIS`).

A layout's dimensions are listed outermost first, as `init_device_mesh(..., mesh_dim_names)`
takes them: `Layout((("pp", 2), ("dp", 2), ("tp", 2)))` is Megatron-LM's and torchtitan's order,
tensor-parallel innermost (its ranks consecutive, on one node's fast links), pipeline outermost:

    rank = tp_rank + tp * (dp_rank + dp * pp_rank)
"""
from __future__ import annotations

import enum
import math
from typing import Iterable, Optional, Union


class Axis(str, enum.Enum):
    """A parallel axis; the value is the short name used in labels, metrics and reports."""

    TP = "tp"                  # tensor parallel
    CP = "cp"                  # context (sequence) parallel
    EP = "ep"                  # expert parallel
    DP_SHARD = "dp_shard"      # sharded data parallel: FSDP / ZeRO-3
    DP = "dp"                  # replicated data parallel (DDP; HSDP's replicate dimension)
    PP = "pp"                  # pipeline parallel

    def __str__(self) -> str:  # f"{Axis.TP}" -> "tp" on every Python version
        return self.value


# Every axis diag names, in the canonical order innermost first (Megatron-Core's "tp-cp-ep-dp-pp"
# with FSDP's shard dimension inside the replicate one, as torchtitan's mesh has it); then the
# flattened groups frameworks build over two axes. A communication op's axis is stored as an index
# into this tuple (int8), so its order is part of the summary-file format: append, never reorder.
AXES: tuple[str, ...] = ("tp", "cp", "ep", "dp_shard", "dp", "pp", "dp_shard_cp", "dp_cp")
FLATTENED: dict[str, tuple[str, ...]] = {"dp_shard_cp": ("dp_shard", "cp"), "dp_cp": ("dp", "cp")}
UNKNOWN = -1
RANK_ORDER = "tp-cp-ep-dp_shard-dp-pp"   # innermost first, as diag_run.json records it

# Process-group descriptions (`pg_config[].pg_desc`) that name an axis: DeviceMesh dims are
# "mesh_<dim>" (torchtitan's names on the right), Megatron-Core passes `group_desc`, our trainer
# its axis name. Anything else (default_pg, undefined, EMBEDDING_GROUP, ...) names no axis.
DESC_AXIS: dict[str, str] = {
    "tp": "tp", "cp": "cp", "ep": "ep", "pp": "pp", "dp": "dp", "dp_shard": "dp_shard",
    "dp_replicate": "dp", "dp_shard_cp": "dp_shard_cp", "dp_cp": "dp_cp", "fsdp": "dp_shard",
    "TENSOR_MODEL_PARALLEL_GROUP": "tp", "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "DATA_PARALLEL_GROUP": "dp", "DATA_PARALLEL_GROUP_GLOO": "dp", "CONTEXT_PARALLEL_GROUP": "cp",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp_cp", "DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp_cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
}


def stage_layer_counts(num_layers: int, stages: int, first: int = 0, last: int = 0) -> list[int]:
    """Layers of each of `stages` pipeline stages, in stage order, by Megatron-LM's split: the first
    and last stages may be given their own counts (`--decoder-first-pipeline-num-layers`,
    `--decoder-last-pipeline-num-layers`; 0: no count of its own), the others share the rest evenly.
    ValueError when they do not split so (a stage with no layer, or a rest that does not divide)."""
    counts = [0] * stages
    if first:
        counts[0] = first
    if last and stages > 1:
        counts[-1] = last
    fixed = sum(1 for c in counts if c)
    rest, even = num_layers - sum(counts), stages - fixed
    if rest < even or (even and rest % even) or (not even and rest):
        raise ValueError(f"{num_layers} layers do not split into {stages} pipeline stages"
                         + (" with the given first/last stage layers" if fixed else ""))
    return [c or rest // max(even, 1) for c in counts]


def axis_of_desc(desc: object) -> Optional[str]:
    """The axis a process-group description names, or None."""
    if not isinstance(desc, str):
        return None
    name = desc[5:] if desc.startswith("mesh_") else desc
    return DESC_AXIS.get(name)


def axis_index(name: str) -> int:
    return AXES.index(name) if name in AXES else UNKNOWN


def axis_name(index: int) -> str:
    return AXES[index] if 0 <= index < len(AXES) else "unknown"


class Coords:
    """The position of one rank: `c["tp"]` or `c.tp_rank`; an axis the layout lacks is 0."""

    __slots__ = ("_of",)

    def __init__(self, of: dict[str, int]) -> None:
        self._of = of

    def __getitem__(self, axis: str) -> int:
        return self._of.get(str(axis), 0)

    def __getattr__(self, name: str) -> int:
        if name.endswith("_rank") and name[:-5] in AXES:
            return self._of.get(name[:-5], 0)
        raise AttributeError(name)

    def __iter__(self):  # tp, pp, dp = layout.coords(r): the 3D view
        return iter((self["tp"], self["pp"], self["dp"]))

    def __eq__(self, other) -> bool:
        return isinstance(other, Coords) and {k: v for k, v in self._of.items() if v} == \
            {k: v for k, v in other._of.items() if v}

    def __repr__(self) -> str:
        return "Coords(" + ", ".join(f"{k}={v}" for k, v in self._of.items()) + ")"


Dims = tuple[tuple[str, int], ...]


class Layout:
    """Named axes with sizes, outermost first; axes of size 1 may be left out."""

    def __init__(self, dims: Iterable[tuple[str, int]], source: str = "") -> None:
        dims = tuple((str(Axis(a)), s) for a, s in dims)
        names = [a for a, _ in dims]
        if len(set(names)) != len(names):
            raise ValueError(f"an axis appears twice in the layout {names}")
        for a, s in dims:
            if not isinstance(s, int) or isinstance(s, bool) or s < 1:
                raise ValueError(f"{a} size must be a positive integer, got {s!r}")
        self.dims: Dims = dims
        self.source = source            # where it was found: "process-group names", "--tp/--pp", ...
        self._stride = {}
        stride = 1
        for a, s in reversed(dims):
            self._stride[a] = stride
            stride *= s
        self.world_size = stride

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def megatron(cls, tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, ep: int = 1,
                 dp_shard: int = 1, source: str = "") -> "Layout":
        """Megatron-LM / torchtitan rank order (RANK_ORDER), axes of size 1 left out."""
        sizes = {"tp": tp, "cp": cp, "ep": ep, "dp_shard": dp_shard, "dp": dp, "pp": pp}
        order = RANK_ORDER.split("-")
        return Layout([(a, sizes[a]) for a in reversed(order) if sizes[a] != 1], source)

    @classmethod
    def from_world(cls, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
                   dp_shard: int = 1, source: str = "") -> "Layout":
        """The layout of a job of `world_size` ranks; replicated DP is what the others leave.

        Expert parallelism is carved out of the data-parallel ranks (Megatron-LM, torchtitan): `ep`
        must divide them, and does not multiply the world size nor appear as a dimension."""
        given = tp * pp * cp * dp_shard
        if world_size < 1 or min(tp, pp, cp, ep, dp_shard) < 1 or world_size % given \
                or (world_size // given) % ep and (dp_shard * world_size // given) % ep:
            named = " x ".join(f"{a} {s}" for a, s in (("TP", tp), ("PP", pp), ("CP", cp), ("EP", ep),
                                                       ("DP shard", dp_shard)) if s != 1) or "1"
            raise ValueError(f"world size {world_size} is not divisible by {named}")
        return cls.megatron(tp=tp, pp=pp, cp=cp, dp_shard=dp_shard, dp=world_size // given, source=source)

    # -- questions ----------------------------------------------------------------------------
    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.dims)

    def size(self, axis: Union[str, Axis, tuple]) -> int:
        if isinstance(axis, tuple):
            return math.prod(self.size(a) for a in axis)
        if str(axis) in FLATTENED:
            return self.size(FLATTENED[str(axis)])
        return dict(self.dims).get(str(Axis(axis)), 1)

    # the 3D view older code and the step-time model use
    tp = property(lambda self: self.size("tp"))
    pp = property(lambda self: self.size("pp"))
    dp = property(lambda self: self.size("dp"))
    cp = property(lambda self: self.size("cp"))
    ep = property(lambda self: self.size("ep"))
    dp_shard = property(lambda self: self.size("dp_shard"))

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range [0, {self.world_size})")
        return Coords({a: (rank // self._stride[a]) % s for a, s in self.dims})

    def rank(self, *args: int, **coords: int) -> int:
        """Global rank of the given coordinates: keywords `tp_rank=`/`tp=`, or (tp, pp, dp)."""
        if args:
            coords = dict(zip(("tp", "pp", "dp"), args))
        r = 0
        for key, value in coords.items():
            a = key[:-5] if key.endswith("_rank") else key
            size = self.size(a)
            if not 0 <= value < size:
                raise ValueError(f"{a}_rank {value} out of range [0, {size})")
            if a in self._stride:
                r += value * self._stride[a]
        return r

    def _members(self, axes: tuple[str, ...]) -> list[str]:
        flat: list[str] = []
        for a in axes:
            flat += list(FLATTENED[str(a)]) if str(a) in FLATTENED else [str(Axis(a))]
        return [a for a in flat if a in self._stride]

    def group_of(self, rank: int, axis: Union[str, Axis, tuple]) -> list[int]:
        """The group along `axis` (or the flattened axes of a tuple) that holds `rank`, sorted."""
        axes = self._members(axis if isinstance(axis, tuple) else (axis,))
        c = self.coords(rank)
        base = rank - sum(c[a] * self._stride[a] for a in axes)
        group = [base]
        for a in axes:
            group = [g + i * self._stride[a] for g in group for i in range(self.size(a))]
        return sorted(group)

    def groups(self, axis: Union[str, Axis, tuple]) -> list[list[int]]:
        """Every group along `axis`, each sorted, in order of their first rank (the same on every
        rank: the trainer creates them in this order)."""
        seen, out = set(), []
        for r in range(self.world_size):
            if r not in seen:
                g = self.group_of(r, axis)
                seen.update(g)
                out.append(g)
        return out

    def stage(self, rank: int) -> int:
        return self.coords(rank)["pp"]

    def is_first_stage(self, rank: int) -> bool:
        return self.stage(rank) == 0

    def is_last_stage(self, rank: int) -> bool:
        return self.stage(rank) == self.pp - 1

    def describe(self) -> str:
        """'pp2 × dp2 × tp2' (outermost first)."""
        return " × ".join(f"{a}{s}" for a, s in self.dims) or "1 rank"

    def as_dict(self) -> dict:
        return {"dims": [[a, s] for a, s in self.dims], "source": self.source}

    def __eq__(self, other) -> bool:
        return isinstance(other, Layout) and \
            tuple(d for d in self.dims if d[1] != 1) == tuple(d for d in other.dims if d[1] != 1)

    def __hash__(self) -> int:
        return hash(tuple(d for d in self.dims if d[1] != 1))

    def __repr__(self) -> str:
        return f"Layout({self.describe()})"


class RankGrid(Layout):
    """The TP x PP x DP layout in Megatron-LM's order: `RankGrid(tp=2, pp=2, dp=2)`; with `cp` the
    context-parallel axis between TP and DP (RANK_ORDER), left out at cp 1."""

    def __init__(self, tp: int, pp: int, dp: int, source: str = "", cp: int = 1) -> None:
        super().__init__((("pp", pp), ("dp", dp)) + ((("cp", cp),) if cp != 1 else ()) + (("tp", tp),), source)
