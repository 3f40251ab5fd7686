"""Are a decoded summary's values possible? A summary's digest only says its bytes are the ones
written; a summary made by another program, or forged, can still carry NaN times, an array of
floats where the merge expects integer ids, or a breakdown whose parts exceed its span. Any of
those would come out as a wrong number, so such a summary is refused (the trace is read instead,
or the rank reported as a problem). A rank that cannot be one (negative, or past any int32
column) is not a reason to drop the rank's numbers: it becomes unknown, with a note, as for a
trace whose distributedInfo has no usable rank.
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from ..layout import AXES
from ..trace.errors import TraceError
from ..trace.kinds import Coll
from .ppactions import ACTIONS

_RANK_MAX = (1 << 31) - 1                      # ranks live in int32 columns
_BOOL_ARRAYS = {"fsdp", "sure"}
_NONNEG_ARRAYS = {"dur_ns", "exposed_ns", "host_ns", "group_size", "t_ns", "allocated"}
_FRACTIONS = {"share", "ratio"}
# Arrays of codes: [low, high) of what the merge indexes or converts with them.
_CODES = {"coll": (min(Coll), max(Coll) + 1), "axis": (-1, len(AXES)), "act_kind": (0, len(ACTIONS)),
          "step": (-1, None), "peer": (-1, None), "act_stage": (-1, None), "act_mb": (-1, None), "lane": (-1, None),
          "act_start_ns": (-1, None), "act_end_ns": (-1, None)}
_TOL = 1e-6
# Times fit int64 nanoseconds with room for a sum of two (start + duration, clock0 + start): 2^62 ns
# is 146 years, far past any clock a trace holds, so a time past it is damage (it would overflow
# or wrap the merge's int64 arithmetic).
_TIME_MAX_NS = 1 << 62
_TIME_ARRAYS = {"blocked_lo", "blocked_hi", "issued_lo", "issued_hi", "wrapped_lo", "wrapped_hi", "wait_lo", "wait_hi",
                "interval"}


def check_values(path: str, s) -> None:
    """Raise TraceError naming `path` for an impossible value in RankSummary `s`; an impossible
    rank or world size becomes unknown, with a note in the rank's result."""
    _walk(path, s, "summary")
    _check_plain(path, s)
    _check_breakdown(path, s.result.breakdown)
    _check_memory(path, s.memory)
    pp = s.pp
    if bool(((pp.act_end_ns < pp.act_start_ns) | ((pp.act_start_ns < 0) != (pp.act_end_ns < 0))).any()):
        raise TraceError(path, "corrupt summary: summary.pp holds actions that end before they start")
    p2p = s.pp.p2p
    if p2p.wait_op.size and not (0 <= int(p2p.wait_op.min()) and int(p2p.wait_op.max()) < p2p.peer.size):
        raise TraceError(path, "corrupt summary: summary.pp.p2p.wait_op points past its ops")
    for name in ("rank", "world_size"):
        v = getattr(s, name)
        low = 1 if name == "world_size" else 0
        if v is not None and not (low <= v <= _RANK_MAX):
            setattr(s, name, None)
            s.result.notes.append(f"the summary's {name.replace('_', ' ')} {v} is not possible "
                                  f"({low} to {_RANK_MAX:,}): taken as unknown")
    if s.rank is not None and s.world_size is not None and s.rank >= s.world_size:
        s.result.notes.append(f"the summary's rank {s.rank} is not below its world size {s.world_size}: "
                              "rank taken as unknown")
        s.rank = None


def _walk(path: str, obj, where: str) -> None:
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _value(path, getattr(obj, f.name), f.name, f"{where}.{f.name}")
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            _walk(path, x, f"{where}[{i}]")


def _value(path: str, v, name: str, where: str) -> None:
    if isinstance(v, float):
        bad = not math.isfinite(v) or ((name.endswith(("_s", "_per_step")) or name in _FRACTIONS or name == "mean_us")
                                       and v < 0) \
            or (name in _FRACTIONS and v > 1 + _TOL) \
            or (name.endswith("_us") and abs(v) * 1e3 >= _TIME_MAX_NS) \
            or (name.endswith(("_s", "_per_step")) and abs(v) * 1e9 >= _TIME_MAX_NS)
        if bad:
            raise TraceError(path, f"corrupt summary: {where} = {v!r} is not possible")
    elif isinstance(v, np.ndarray):
        _array(path, v, name, where)
    elif isinstance(v, tuple) and v and all(isinstance(a, np.ndarray) for a in v):
        for a in v:                                        # an interval set: (starts, ends)
            _array(path, a, "interval", where)
        if len(v) == 2 and (v[0].size != v[1].size or bool((v[1] < v[0]).any())):
            raise TraceError(path, f"corrupt summary: {where} holds intervals that end before they start")
    else:
        _walk(path, v, where)


def _array(path: str, a: np.ndarray, name: str, where: str) -> None:
    want = "b" if name in _BOOL_ARRAYS else "i"
    if a.dtype.kind != want:
        raise TraceError(path, f"corrupt summary: {where} is {a.dtype}, expected "
                               f"{'booleans' if want == 'b' else 'integers'}")
    if name in _NONNEG_ARRAYS and a.size and int(a.min()) < 0:
        raise TraceError(path, f"corrupt summary: {where} holds negative values")
    if (name.endswith("_ns") or name in _TIME_ARRAYS) and a.size and \
            max(abs(int(a.min())), abs(int(a.max()))) >= _TIME_MAX_NS:
        raise TraceError(path, f"corrupt summary: {where} holds times past 2^62 ns")
    low, high = _CODES.get(name, (None, None))
    if a.size and ((low is not None and int(a.min()) < low) or (high is not None and int(a.max()) >= high)):
        raise TraceError(path, f"corrupt summary: {where} holds codes outside [{low}, {high})")


_GROUP_KEY = re.compile(r"-?\d+(,-?\d+)*")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_plain(path: str, s) -> None:
    """The fields the summary's types leave open (plain lists the merge reads by position): each
    holds what the per-rank pass writes there, else the summary is refused, not half-used."""
    bad = None
    keys = [("comms", s.comms.group), ("pp.p2p", s.pp.p2p.group)]
    wrong = [w for w, col in keys if not all(g is None or (isinstance(g, str) and _GROUP_KEY.fullmatch(g)) for g in col)]
    if wrong:
        bad = f"summary.{wrong[0]}.group holds a member key that is not ranks ('0,1')"
    elif not all(isinstance(pg, list) and len(pg) == 3 and isinstance(pg[0], str) and isinstance(pg[1], str)
                 and isinstance(pg[2], list) and all(_is_int(r) and 0 <= r < 1 << 24 for r in pg[2])
                 for pg in s.pg_config):
        bad = "summary.pg_config holds a group that is not [name, description, [ranks]]"
    elif not all(isinstance(g, list) and len(g) == 3 and isinstance(g[0], str) and _is_int(g[2]) and g[2] > 0
                 and isinstance(g[1], list)
                 and all(isinstance(d, list) and all(_is_int(x) and 0 <= x < 1 << 63 for x in d) for d in g[1])
                 for g in s.gemms):
        bad = "summary.gemms holds an entry that is not [op, [input dims], count]"
    if bad:
        raise TraceError(path, f"corrupt summary: {bad}")


def _check_breakdown(path: str, b) -> None:
    parts = b.compute_s + b.comm_s + b.memory_s + b.other_s + b.idle_s
    if abs(parts - b.span_s) > _TOL * max(1.0, b.span_s):
        raise TraceError(path, f"corrupt summary: its breakdown's parts add up to {parts:.6g} s, "
                               f"its span is {b.span_s:.6g} s")


def _check_memory(path: str, m) -> None:
    """A measured peak is the largest point of its curve, a curve runs forward in time, and an
    unknown peak (-1) has no curve and says why."""
    bad = None
    if m.t_ns.size != m.allocated.size:
        bad = "its memory curve's columns differ in length"
    elif m.t_ns.size > 1 and bool((m.t_ns[1:] < m.t_ns[:-1]).any()):
        bad = "its memory curve runs backwards in time"
    elif m.events < 0 or m.peak_bytes < -1 or m.events < m.t_ns.size:
        bad = f"its memory events ({m.events}) or peak ({m.peak_bytes}) are not possible"
    elif m.peak_bytes == -1 and (m.t_ns.size or not m.why):
        bad = "its memory peak is unknown but it has a curve, or no reason"
    elif m.peak_bytes >= 0 and (not m.allocated.size or int(m.allocated.max()) != m.peak_bytes):
        bad = "its memory peak is not the largest point of its curve"
    if bad:
        raise TraceError(path, f"corrupt summary: {bad}")
