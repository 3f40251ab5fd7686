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


# Host-side spans that describe communication (their args say what the kernel does not).
HOST_COMM_RE = re.compile(r"^(gloo:|c10d::|nccl:|diag:comm:|record_param_comms$)")


def _input_nelems(a) -> Optional[int]:
    """Elements of the first input from `Input Dims` ([[4, 8]] -> 32), when recorded."""
    dims = a.input_dims if a is not None else None
    if isinstance(dims, list) and dims and isinstance(dims[0], list):    # [] is a scalar: 1 element
        n = 1
        for d in dims[0]:
            if not isinstance(d, int) or d < 0:
                return None
            n *= d
        return n
    return None


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

    in_n = col("in_nelems", np.int64)
    fallback = np.array([_input_nelems(a) if n < 0 else None for a, n in zip(picked, in_n)], dtype=object)
    use = np.flatnonzero((in_n < 0) & (fallback != None))  # noqa: E711 - elementwise None test
    in_n[use] = fallback[use].astype(np.int64)
    dtypes = [dtype_bytes(a.dtype) or (dtype_bytes(a.input_type[0]) if isinstance(a.input_type, list) and a.input_type else 0)
              if a is not None else 0 for a in picked]
    return CommTable(
        row=rows.astype(np.int64), coll=np.array(coll, dtype=np.int8), pg=np.array(pg, dtype=np.int32),
        group=np.array(groups, dtype=np.int32),
        group_size=np.maximum(col("group_size", np.int32), 0), in_nelems=in_n,
        out_nelems=col("out_nelems", np.int64), dtype_bytes=np.array(dtypes, dtype=np.int8),
        seq=col("seq", np.int64),
    )


