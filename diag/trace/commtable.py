"""The communication table: what each communication event moved, in which group.

Built from the args of GPU communication kernels (NCCL's `Collective name`, `In msg
nelems`, `Group size`, `dtype`, `Process Group Ranks`) and of the host spans that
describe communication (`record_param_comms`, `c10d::*`, `gloo:*`, `nccl:*`, the
trainer's `diag:comm:*`), with `Input Dims` / `Input type` as the fallback for sizes.
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np

from . import schema
from .columns import num_column
from .kinds import Coll, Kind, coll_from_arg, coll_from_host_op, coll_from_kernel, dtype_bytes
from .symbols import SymbolTable
from .table import CommTable, EventTable

def pg_ranks_of(doc: schema.TraceFile) -> dict[str, list]:
    """Process-group name -> member ranks, from distributedInfo.pg_config."""
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    out = {}
    configs = info.get("pg_config")
    for pg in configs if isinstance(configs, list) else []:
        if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
            out[str(pg.get("pg_name"))] = pg["ranks"]
    return out


def group_key(ranks: object) -> Optional[str]:
    """Member ranks ('[0, 1]' as written in args, or a list) -> canonical key '0,1'."""
    if isinstance(ranks, str):
        ranks = [p for p in ranks.strip("[] ").replace(" ", "").split(",") if p]
    if not isinstance(ranks, list) or not ranks:
        return None
    try:
        return ",".join(str(r) for r in sorted(int(r) for r in ranks))
    except (TypeError, ValueError):
        return None


# Host-side spans that describe communication (their args say what the kernel does not), and
# the functional collectives' ops (`_c10d_functional::wait_tensor`: the shape it waits on).
HOST_COMM_RE = re.compile(r"^(gloo:|c10d::|_?c10d_functional(_autograd)?::|nccl:|diag:comm:|record_param_comms$)")

# c10d's collectives on whole tensors take (output, input): `Input Dims` list the output first.
# Their list forms (`allgather_`, `reduce_scatter_`, ...) hold one tensor per rank: sizes unknown.
_OUTPUT_FIRST_RE = re.compile(r"^c10d::(_allgather_base_|allgather_into_tensor_coalesced_|_reduce_scatter_base_"
                              r"|reduce_scatter_tensor_coalesced_|alltoall_base_)$")
_PER_RANK_LISTS_RE = re.compile(r"^c10d::(allgather|reduce_scatter|alltoall|gather|scatter)(_coalesced)?_$")
_MAX_NELEMS = 1 << 62


def _tensor_nelems(dims) -> Optional[int]:
    """Elements of one argument from its `Input Dims` entry: a tensor [4, 8] -> 32, [] (a
    scalar) -> 1, a tensor list [[4, 8], [2]] -> its first tensor's."""
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        dims = dims[0]
    if not isinstance(dims, list):
        return None
    n = 1
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            return None
        n *= d
    return n if n < _MAX_NELEMS else None


def _dims_nelems(name: str, a) -> tuple[Optional[int], Optional[int]]:
    """(input, output) elements from `Input Dims`, when recorded: a c10d collective that takes
    (outputs, inputs) lists its output first (`_reduce_scatter_base_`: [[4096], [8192]]); any
    other op's first argument is its input."""
    dims = a.input_dims if a is not None else None
    if not isinstance(dims, list) or not dims or _PER_RANK_LISTS_RE.match(name):
        return None, None
    if _OUTPUT_FIRST_RE.match(name) and len(dims) >= 2:
        return _tensor_nelems(dims[1]), _tensor_nelems(dims[0])
    return _tensor_nelems(dims[0]), None


def _fill_unknown(col: np.ndarray, values: list) -> None:
    """Fill the unknown (-1) entries of an element-count column from values (None: still unknown)."""
    known = np.array([-1 if v is None else v for v in values], np.int64)
    col[col < 0] = known[col < 0]


# c10d's point-to-point ops, each the call that posts one transfer to the backend. They take (tensors,
# process group, peer, tag): the peer is the third of their `Concrete Inputs`, a rank within the op's
# group (torch.distributed converts global ranks); recv_any_source_ names none.
P2P_OPS = frozenset({"c10d::send", "c10d::recv_", "c10d::recv_any_source_"})
_PEERED = P2P_OPS - {"c10d::recv_any_source_"}


def _peer(name: str, a) -> int:
    """The group-local peer of a c10d send/recv, -1 when the trace does not say."""
    if name not in _PEERED or a is None or not isinstance(a.concrete, list) or len(a.concrete) < 3:
        return -1
    peer = a.concrete[2]
    return int(peer) if isinstance(peer, str) and peer.isdigit() and len(peer) < 9 else -1


def host_comm_mask(name_ids: np.ndarray, kind: np.ndarray, symbols: SymbolTable) -> np.ndarray:
    hits = np.fromiter((bool(HOST_COMM_RE.match(s)) for s in symbols.names), dtype=bool, count=len(symbols))
    return hits[name_ids] & np.isin(kind, [Kind.CPU_OP, Kind.ANNOTATION])


def comm_table(table: EventTable, args: dict, host: np.ndarray, pg_ranks: dict) -> CommTable:
    rows = np.flatnonzero((table.kind == Kind.COMM) | host)
    picked = [args[i] for i in rows]
    names = [table.symbols[int(table.name_id[i])] for i in rows]
    coll = [coll_from_arg(a.collective) if a is not None and a.collective else Coll.UNKNOWN for a in picked]
    coll = [c if c != Coll.UNKNOWN else (coll_from_kernel(n) if n.startswith("nccl") and "Kernel" in n
                                         else coll_from_host_op(n)) for c, n in zip(coll, names)]
    pg = [table.symbols.intern(str(a.pg_name)) if a is not None and a.pg_name is not None else -1 for a in picked]
    groups = []
    for a in picked:
        key = None if a is None else (group_key(a.pg_ranks) or group_key(pg_ranks.get(str(a.pg_name))))
        groups.append(table.symbols.intern(key) if key else -1)

    def col(attr, dtype):
        return num_column([getattr(a, attr) if a is not None else None for a in picked], dtype)

    in_n, out_n = col("in_nelems", np.int64), col("out_nelems", np.int64)
    dims = [_dims_nelems(n, a) if i < 0 or o < 0 else (None, None)
            for n, a, i, o in zip(names, picked, in_n.tolist(), out_n.tolist())]
    _fill_unknown(in_n, [d[0] for d in dims])
    _fill_unknown(out_n, [d[1] for d in dims])
    dtypes = [dtype_bytes(a.dtype) or (dtype_bytes(a.input_type[0]) if isinstance(a.input_type, list) and a.input_type else 0)
              if a is not None else 0 for a in picked]
    return CommTable(
        row=rows.astype(np.int64), coll=np.array(coll, dtype=np.int8), pg=np.array(pg, dtype=np.int32),
        group=np.array(groups, dtype=np.int32),
        group_size=np.maximum(col("group_size", np.int32), 0), in_nelems=in_n,
        out_nelems=out_n, dtype_bytes=np.array(dtypes, dtype=np.int8),
        seq=col("seq", np.int64),
        peer=np.array([_peer(n, a) for n, a in zip(names, picked)], dtype=np.int32),
    )


