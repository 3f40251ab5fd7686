"""Top GPU kernels by total time: which kernels the GPU time goes to."""
from __future__ import annotations

import numpy as np

from ..trace.kinds import Kind
from ..trace.table import EventTable
from .results import KernelStat


def top_kernels(t: EventTable, rows: np.ndarray, n: int = 10) -> list[KernelStat]:
    if rows.size == 0:
        return []
    ids, inv = np.unique(t.name_id[rows], return_inverse=True)
    total = np.bincount(inv, weights=t.dur_ns[rows].astype(np.float64))
    count = np.bincount(inv)
    kinds = np.zeros(ids.size, dtype=np.int8)
    kinds[inv] = t.kind[rows]
    grand = total.sum()
    order = np.argsort(-total, kind="stable")[:n]
    return [KernelStat(name=t.symbols[int(ids[i])], kind=Kind(int(kinds[i])).name.lower(),
                       count=int(count[i]), total_s=float(total[i]) * 1e-9,
                       share=float(total[i] / grand) if grand else 0.0,
                       mean_us=float(total[i] / count[i]) * 1e-3)
            for i in order]
