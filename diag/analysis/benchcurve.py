"""Measured collective bandwidth curves from `instrumented_trainer.collbench` JSON (torch-free).

`load_bench(path)` reads the benchmark's output; `BenchCurve.busbw_at(axis, op, nbytes)` gives
the busbw in GB/s (1e9 bytes/s, the unit of the report's busbw columns; the JSON and
`points` hold bytes/s) that the benchmark measured for that axis and collective at that
message size, linearly
interpolated in log2(size) between the two nearest measured sizes. Outside the measured range,
or for an axis/op that was not measured (or was skipped), it returns None: extrapolating a
latency-bound or not-yet-flat curve would invent numbers.
"""
from __future__ import annotations

import bisect
import json
import math
from dataclasses import field

from ..trace.errors import TraceError
from ..trace.kinds import Coll, bench_op, coll_from_arg
from ..record import record

SCHEMA = "diag.collbench/1"
_REQUIRED = ("axis", "op", "bytes", "time_s", "busbw", "group_size")


def op_name(op) -> str | None:
    """collbench op name for a str op name or a `Coll` value (None if it has none)."""
    if isinstance(op, Coll):
        return bench_op(op)
    coll = coll_from_arg(op)
    return bench_op(coll) if coll != Coll.UNKNOWN else str(op)


@record
class BenchCurve:
    """Measured busbw by (axis, op): points are (bytes, busbw in bytes/s), sorted by size."""

    backend: str
    device: str
    world_size: int
    points: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)
    skipped: list[dict] = field(default_factory=list)

    def busbw_at(self, axis, op, nbytes) -> float | None:
        """busbw in GB/s at `nbytes`, interpolated in log2(size); None outside the range."""
        bw = self._bytes_per_s_at(axis, op, nbytes)
        return None if bw is None else bw / 1e9

    def _bytes_per_s_at(self, axis, op, nbytes) -> float | None:
        pts = self.points.get((str(axis), op_name(op) or ""))
        if not pts or nbytes is None or not math.isfinite(nbytes) or nbytes <= 0:
            return None
        if nbytes < pts[0][0] or nbytes > pts[-1][0]:
            return None
        sizes = [s for s, _ in pts]
        j = bisect.bisect_left(sizes, nbytes)
        if sizes[j] == nbytes:
            return pts[j][1]
        (s0, b0), (s1, b1) = pts[j - 1], pts[j]
        w = (math.log2(nbytes) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
        return b0 + w * (b1 - b0)


def _bad(path, problem):
    return TraceError(str(path), f"not a collbench result: {problem}")


def _point(path, i, r) -> tuple[tuple[str, str], tuple[int, float]]:
    if not isinstance(r, dict):
        raise _bad(path, f"results[{i}] is not an object")
    missing = [k for k in _REQUIRED if k not in r]
    if missing:
        raise _bad(path, f"results[{i}] lacks {', '.join(missing)}")
    try:
        size, bw = int(r["bytes"]), float(r["busbw"])
    except (TypeError, ValueError):
        raise _bad(path, f"results[{i}] has a non-numeric bytes or busbw") from None
    if size <= 0 or not math.isfinite(bw) or bw < 0:
        raise _bad(path, f"results[{i}] has bytes {r['bytes']!r}, busbw {r['busbw']!r}")
    return (str(r["axis"]), str(r["op"])), (size, bw)


def parse_bench(doc, path="<bench>") -> BenchCurve:
    """BenchCurve from an already-parsed collbench document."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise _bad(path, f"expected an object with schema {SCHEMA!r}")
    if not isinstance(doc.get("results"), list):
        raise _bad(path, "'results' is missing or not a list")
    curve = BenchCurve(str(doc.get("backend")), str(doc.get("device")),
                       int(doc.get("world_size") or 0), skipped=list(doc.get("skipped") or []))
    for i, r in enumerate(doc["results"]):
        key, pt = _point(path, i, r)
        curve.points.setdefault(key, []).append(pt)
    for key, pts in curve.points.items():
        pts.sort()
        if len({s for s, _ in pts}) != len(pts):
            raise _bad(path, f"duplicate message sizes for axis {key[0]} op {key[1]}")
    return curve


def load_bench(path) -> BenchCurve:
    """Read a collbench JSON file; TraceError naming the file and the problem if it is bad."""
    from ..trace.safeio import read_regular

    try:
        doc = json.loads(read_regular(str(path)))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(str(path), f"not valid JSON: {e}") from None
    except RecursionError:
        raise TraceError(str(path), "not valid JSON: nested too deep") from None
    return parse_bench(doc, path)
