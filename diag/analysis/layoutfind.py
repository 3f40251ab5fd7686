"""The layout of a job, found from what its traces and its user say.

Most traces were not written by our trainer: no `diag:comm` labels, no `diag_run.json`. What
they do carry is `distributedInfo.pg_config`: every process group a rank belongs to, with its
member ranks and, on recent PyTorch, a description (`mesh_tp` for a DeviceMesh dimension,
`TENSOR_MODEL_PARALLEL_GROUP` from Megatron-Core). Sources, strongest first:

1. process-group names, joined over all rank files: each named group is that axis, whatever else
   is said; when the named groups tile the world as a grid, that grid is the layout;
2. sizes from the trainer's `diag_run.json`, a framework config file (`--config`) or flags
   (`--tp/--pp/...`), laid out in Megatron-LM's rank order; unnamed groups whose members are a
   group of that layout get its axis (the rank structure of the groups);
3. nothing: the axes stay unknown, and the note says which groups exist and what would name them.

The result says where it came from ("pp2 × dp2 × tp2, from process-group names"); a size given
by the user that contradicts the names is reported, never silently preferred.
"""
from __future__ import annotations

from dataclasses import field
from typing import Optional

from ..layout import AXES, FLATTENED, UNKNOWN, Layout, axis_index, axis_of_desc
from ..trace.commtable import group_key      # one canonical key for a group's member ranks: "0,2"
from ..record import record

BASE_AXES = tuple(a for a in AXES if a not in FLATTENED)
SIZE_KEYS = ("tp", "pp", "cp", "ep", "dp_shard")      # what flags, config files and diag_run.json give
# A group's member list is built from the layout only up to this size: the sizes are claims (a
# flag, diag_run.json), and a key that long matches no group a trace names anyway.
MAX_KEY_RANKS = 1 << 16


def compact_pg_config(pg_config: list) -> list[list]:
    """[pg_name, pg_desc, [ranks]] per group: the part of `pg_config` the layout needs (plain data,
    small enough for a rank summary)."""
    out = []
    for pg in pg_config if isinstance(pg_config, list) else []:
        if not isinstance(pg, dict) or not isinstance(pg.get("ranks"), list):
            continue
        ranks = sorted({r for r in pg["ranks"] if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 1 << 24})
        if ranks:
            out.append([str(pg.get("pg_name")), str(pg.get("pg_desc") or ""), ranks])
    return out


@record
class JobLayout:
    """The layout of one job as far as it is known, and every named group."""

    layout: Optional[Layout] = None
    source: Optional[str] = None                     # where the layout / the names came from
    axis_of_key: dict = field(default_factory=dict)  # group key "0,2" -> index into AXES
    members: dict = field(default_factory=dict)      # (rank, axis) -> group key, for named groups
    notes: list = field(default_factory=list)

    def axis_of(self, key: Optional[str]) -> int:
        """The axis of the group with this key: named, else the layout's group it is (looked up
        for the keys the traces hold, never by listing the layout's groups: a world size a file
        claims, 2^24 with --tp/--pp, must cost nothing per claimed rank)."""
        if not key:
            return UNKNOWN
        if key not in self.axis_of_key and self.layout is not None:
            self.axis_of_key[key] = _layout_axis(self.layout, key)
        return self.axis_of_key.get(key, UNKNOWN)

    def group_of(self, rank: int, axis: str) -> Optional[tuple[str, int]]:
        """(key, size) of `rank`'s group along `axis`: named in the trace, or from the layout."""
        key = self.members.get((rank, axis))
        if key is None and self.layout is not None and 0 <= rank < self.layout.world_size \
                and 1 < self.layout.size(axis) <= MAX_KEY_RANKS:
            key = group_key(self.layout.group_of(rank, axis))
        return (key, key.count(",") + 1) if key else None

    @property
    def pp(self) -> int:
        if self.layout is not None:
            return self.layout.pp
        sizes = [k.count(",") + 1 for (r, a), k in self.members.items() if a == "pp"]
        return max(sizes, default=1)

    def stage(self, rank: int) -> Optional[int]:
        """The pipeline stage of `rank`: its place in its pipeline group."""
        if self.layout is not None:
            return self.layout.stage(rank) if 0 <= rank < self.layout.world_size else None
        key = self.members.get((rank, "pp"))
        return [int(x) for x in key.split(",")].index(rank) if key else None

    @property
    def world_axis(self) -> Optional[str]:
        """The one axis whose group is the whole world (TP 8 on 8 GPUs), if there is one: then
        every collective that names no group ran in it."""
        if self.layout is None:
            return None
        whole = [a for a in self.layout.axes if self.layout.size(a) == self.layout.world_size > 1]
        return whole[0] if len(whole) == 1 else None

    def describe(self) -> Optional[str]:
        if self.layout is not None:
            return f"{self.layout.describe()}, from {self.source}"
        if self.axis_of_key:
            named = sorted({AXES[a] for a in self.axis_of_key.values()}, key=AXES.index)
            return f"axes {', '.join(named)} named by {self.source}; the full grid is unknown"
        return None


def _named_groups(pg_configs: list[list]) -> tuple[dict, list]:
    """{key: axis} of the groups a description names; [key] of the unnamed ones (not the world)."""
    named, unnamed = {}, []
    for pgs in pg_configs:
        for _, desc, ranks in pgs:
            key = group_key(ranks)
            axis = axis_of_desc(desc)
            if key is None:
                continue
            if axis and (key not in named or named[key] not in BASE_AXES):
                # one set of members named twice (CP and DP x CP at DP 1): the base axis holds the
                # key, for the grid; each op still takes its own group's axis (collectives.py)
                named[key] = axis
            elif desc != "default_pg" and key not in unnamed:
                unnamed.append(key)
    return named, unnamed


def _grid_of_names(named: dict, world: Optional[int]) -> Optional[Layout]:
    """The layout the named groups tile, when they do: each axis's groups equal-sized with one
    stride, the axes' sizes multiplying to the world, and every named group one of the grid's."""
    dims = []
    for axis in BASE_AXES:
        groups = [[int(x) for x in k.split(",")] for k, a in named.items() if a == axis]
        if not groups:
            continue
        size = len(groups[0])
        strides = {g[i + 1] - g[i] for g in groups for i in range(len(g) - 1)}
        if any(len(g) != size for g in groups) or len(strides) != 1:
            return None
        dims.append((next(iter(strides)), axis, size))
    if not dims:
        return None
    try:
        layout = Layout([(a, s) for _, a, s in sorted(dims, reverse=True)])
    except ValueError:
        return None
    if world and layout.world_size != world:
        return None
    for key, axis in named.items():
        first = int(key.split(",")[0])
        if first >= layout.world_size or group_key(layout.group_of(first, axis)) != key:
            return None
    return layout


def _sizes(flags: dict, config: dict, meta: dict) -> tuple[dict, Optional[str]]:
    for facts, source in ((flags, "flags"), (config, config.get("source") or "the config file"),
                          (meta, "diag_run.json")):
        sizes = {k: int(facts[k]) for k in SIZE_KEYS
                 if isinstance(facts.get(k), int) and not isinstance(facts.get(k), bool) and facts[k] >= 1}
        if sizes.get("tp") or sizes.get("pp") or any(sizes.values()):
            if source == "flags":
                source = "--" + "/--".join(k.replace("_", "-") for k in SIZE_KEYS if k in sizes) + " (Megatron rank order)"
            return sizes, source
    return {}, None


def find_layout(pg_configs: list[list], world: Optional[int], flags: Optional[dict] = None,
                config: Optional[dict] = None, meta: Optional[dict] = None) -> JobLayout:
    """pg_configs: each rank's `compact_pg_config`; flags/config/meta: sizes by SIZE_KEYS."""
    flags, config, meta = flags or {}, config or {}, meta or {}
    named, unnamed = _named_groups(pg_configs)
    out = JobLayout()
    layout, source = _grid_of_names(named, world), "process-group names" if named else None
    sizes, size_source = _sizes(flags, config, meta)
    world = world or meta.get("world_size") or config.get("world_size")
    if sizes and isinstance(world, int) and world > 0:
        given = Layout.from_world(world, **sizes, source=size_source)
        if layout is None:
            layout, source = given, (f"{size_source}, with the process-group names" if named else size_source)
        elif given != layout:
            out.notes.append(f"{size_source} say {given.describe()}, but the process-group names make "
                             f"{layout.describe()}: the names are used")
    out.layout, out.source = layout, source
    if layout is not None:
        layout.source = source or ""
    for key, axis in named.items():
        out.axis_of_key[key] = axis_index(axis)
    for key, a in out.axis_of_key.items():
        for r in key.split(","):
            out.members.setdefault((int(r), AXES[a]), key)
    # a group of one rank (an axis of size 1, where a framework makes a group for every axis) moves
    # nothing, so its axis is nothing to ask the sizes for
    left = [k for k in unnamed if out.axis_of(k) == UNKNOWN and "," in k and (not world or k.count(",") + 1 < world)]
    if left and layout is None:
        shapes = sorted({_shape(k) for k in left})
        out.notes.append(f"process groups of {', '.join(shapes)} are not named in the trace: give the sizes "
                         "(--tp/--pp ..., or --config with the job's Megatron-LM arguments or torchtitan TOML) "
                         "to attribute them to axes")
    return out


def _layout_axis(layout: Layout, key: str) -> int:
    """The axis (base axes first, then flattened ones) whose group holding the key's first rank
    is exactly the key's ranks; UNKNOWN if none. Sizes are compared before any group is built."""
    ranks = key.split(",")
    first, n = int(ranks[0]), len(ranks)
    if not 0 <= first < layout.world_size:
        return UNKNOWN
    flattened = tuple(a for a, parts in FLATTENED.items() if all(layout.size(p) > 1 for p in parts))
    for axis in layout.axes + flattened:
        if layout.size(axis) == n > 1 and n <= MAX_KEY_RANKS and group_key(layout.group_of(first, axis)) == key:
            return axis_index(axis)
    return UNKNOWN


def _shape(key: str) -> str:
    ranks = [int(x) for x in key.split(",")]
    steps = {b - a for a, b in zip(ranks, ranks[1:])}
    how = "consecutive" if steps == {1} else f"stride {steps.pop()}" if len(steps) == 1 else "irregular"
    return f"{len(ranks)} ranks ({how})"
