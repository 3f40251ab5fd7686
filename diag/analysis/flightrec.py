"""The thin front of the Flight Recorder analysis: a folder of dumps in, a FlightRecord out.

Reads every rank's dump (a bad one is a Problem naming the file; the others are analysed), finds
the groups and their axes, then the hang state of each group (analysis.hang) and the timings and
late ranks over the whole buffer (analysis.frtimings).
"""
from __future__ import annotations

import os
import time
from typing import Optional

from ..trace.errors import TraceError
from ..trace.flightrec import DUMP_FOLDERS, FRDump, dump_files, read_dump
from .frresults import FlightRecord
from .frtimings import instances, late_ranks, op_timings
from .frp2p import match_p2p
from .hang import (NO_DESC, WORLD, _clock, cause_ranks, complete_members, entry_bytes, group_label, group_members,
                   hang_groups, inferred_groups, name_axes, op_word, size_words, world_size)
from .results import Diagnosis, Problem


def read_dumps(path: str, strict: bool = False) -> tuple[list[FRDump], list[Problem], list[str]]:
    """(one dump per rank, the files that could not be read, notes). A rank with two dumps (ours and
    NCCL's watchdog pickle of the same moment, or an older run's): the one whose latest entry is
    latest is read, the other set aside with a note."""
    dumps, problems = [], []
    for f in dump_files(path):
        try:
            dumps.append(read_dump(f))
        except TraceError as e:
            if strict:
                raise
            problems.append(Problem(e.path, e.problem))
    best: dict[int, FRDump] = {}
    aside: dict[int, list[str]] = {}
    for d in dumps:
        o = best.get(d.rank)
        if o is not None and _newest(o) >= _newest(d):
            aside.setdefault(d.rank, []).append(d.path)
            continue
        if o is not None:
            aside.setdefault(d.rank, []).append(o.path)
        best[d.rank] = d
    notes = [f"rank {r} has {len(aside[r]) + 1} dumps: read {best[r].path}, the latest; set aside "
             f"{', '.join(aside[r])}" for r in sorted(aside)]
    return [best[r] for r in sorted(best)], problems, notes


def _newest(d: FRDump) -> tuple:
    return max((e.created_ns for e in d.entries), default=0), len(d.entries)


def analyse_dumps(dumps: list[FRDump], meta: Optional[dict] = None, sizes: Optional[dict] = None,
                  config_path: Optional[str] = None, job_grid=None) -> FlightRecord:
    """`meta`: the run's facts (diag_run.json, runmeta.given): its world size where the dumps cannot
    give it, and its axis sizes to name groups the dumps' descriptions do not. `sizes` (--tp/--pp ...)
    and `config_path` (--config): the layout as the user gives it, resolved by the same layoutfind
    the traces' analysis uses, in the same order (group names, flags, config file, diag_run.json)."""
    meta = meta or {}
    world, known = world_size(dumps)
    hint = meta.get("world_size")
    if isinstance(hint, int) and hint > 0 and not known and hint >= (world or 0):
        world, known = hint, True
    config = None
    if config_path:
        from ..runconfig import load_config
        config = load_config(config_path, world_size=world if known else None)
        cw = config.get("world_size")
        if isinstance(cw, int) and cw > 0 and not known and cw >= (world or 0):
            world, known = cw, True
    groups = group_members(dumps, world)
    grid = name_axes(dumps, groups, meta, sizes, config)
    grid_words = grid.describe()
    if grid.layout is None and job_grid is not None and job_grid.layout is not None \
            and (world is None or job_grid.layout.world_size >= world):
        grid = job_grid            # the traces beside the dumps settled the layout: the same one names the groups
        grid_words = f"{job_grid.describe()} (the traces' layout)"
    times = [e.created_ns for d in dumps for e in d.entries]
    ranks = sorted(d.rank for d in dumps)
    fr = FlightRecord(files=[d.path for d in dumps], ranks=ranks,
                      entries=len(times), first_ns=min(times, default=None), last_ns=max(times, default=None),
                      layout=grid_words, world_size=world, world_known=known,
                      undumped=[r for r in range(world or 0) if r not in set(ranks)])
    groups, guessed = complete_members(groups, inferred_groups(dumps), grid)   # gloo: members from the layout
    fr.groups = hang_groups(dumps, groups, grid, fr.undumped, guessed)
    fr.p2p, unread = match_p2p(dumps, groups, grid, lambda e: entry_bytes(e, 2))
    _p2p_verdicts(fr.p2p, fr.groups)
    fr.cause = cause_ranks(fr.groups, fr.p2p)
    fr.cause_last = [_latest_words(next(d for d in dumps if d.rank == r), fr.groups) + _beside_undumped(r, fr.groups)
                     for r in fr.cause]
    fr.notes += grid.notes
    _judge(fr, dumps)
    found = instances(dumps, groups)
    axis_of = {g.pg: g.axis if g.axis != "unknown" or g.desc in NO_DESC else g.desc for g in fr.groups}
    fr.timings = op_timings(found, axis_of)
    fr.late, fr.late_basis, fr.late_unknown, fr.late_window_s = late_ranks(found)
    if unread:
        fr.notes.append(f"{unread} point-to-point entries name no peers inside their group's members "
                        "(profiling name `send a->b` / `recv b<-a` in group ranks): not matched")
    backends = {e.op.split(":")[0] for d in dumps for e in d.entries if ":" in e.op}
    fr.backend = next(iter(backends)) if len(backends) == 1 and backends <= {"nccl", "gloo", "xccl", "ucc", "mpi"} else None
    if not any(g.ranks for g in fr.groups):
        fr.notes.append("the dumps record no collective")
    return fr


SNAPSHOT_REASONS = ("SIGUSR1", "end")    # taken on request or at a healthy end: waits there may be in flight


def _judge(fr: FlightRecord, dumps: list[FRDump]) -> None:
    """Hang, snapshot or waiting. A dump records no time or reason of its own (torch's); the
    trainer's say why and when (diag_dump). Taken on SIGUSR1 or at the end with every wait under
    the timeout the entries record: a snapshot, ranks in flight. Taken on a failure or SIGTERM, or a
    wait past the timeout: a hang. No reason recorded (torch's own dumps): a hang, with the wait
    said, a lower bound (to the buffers' last entry), so a person can judge: torch's watchdog
    dumps on a timeout, when the stuck ranks have entered nothing since, so the bound is near zero
    exactly when it is a hang; calling it anything else would be a guess."""
    by = {d.rank: d for d in dumps}
    at = {(d.rank, e.created_ns): e for d in dumps for e in d.entries}
    end_ns = max((t for d in dumps for e in d.entries for t in (e.created_ns, e.completed_ns or 0)), default=0)
    reasons = {d.rank: d.reason for d in dumps}
    if any(reasons.values()):
        seen: dict = {}
        for d in dumps:
            if d.reason:
                seen.setdefault(d.reason, []).append(d)
        fr.taken = ", ".join(f"{why} at {_clock(min(x.taken_ns or 0 for x in ds))} UTC"
                             + (f" (rank{'s' * (len(ds) > 1)} {', '.join(str(x.rank) for x in ds)})"
                                if len(seen) > 1 or len(ds) < len(dumps) else "")
                             for why, ds in seen.items())
    waits, timeouts, lower = [], [], False
    for x in [w for g in fr.hangs for w in g.waiting]:
        d = by.get(x.rank)
        if d is not None and d.taken_ns:
            waits.append((d.taken_ns - x.since_ns) / 1e9)
        else:
            waits.append((end_ns - x.since_ns) / 1e9)
            lower = True
        e = at.get((x.rank, x.since_ns))
        if e is not None and e.timeout_s:
            timeouts.append(e.timeout_s)
    fr.longest_wait_s = max(waits) if waits else None
    fr.wait_is_lower_bound = lower
    fr.timeout_s = min(timeouts) if timeouts else None
    if not fr.hangs:
        fr.verdict_kind = "hang"            # nothing stuck: 'no hang' whatever the reason
        return
    under = fr.timeout_s is not None and fr.longest_wait_s is not None and fr.longest_wait_s < fr.timeout_s
    if all(r in SNAPSHOT_REASONS for r in reasons.values()):
        fr.verdict_kind = "snapshot" if under or fr.timeout_s is None else "hang"
    else:
        fr.verdict_kind = "hang"            # a failure or SIGTERM dump, or no reason recorded


def _p2p_verdicts(pairs, groups) -> None:
    """Each unmatched pair's line: who never posted the matching op, who waits in theirs; and the
    groups whose missing members wait in such an op (not the cause there)."""
    inside = {w.rank: g for g in groups for w in g.waiting}
    in_p2p = {w.rank: x for x in pairs for w in x.waiting}
    for x in pairs:
        other = "recv" if x.op == "send" else "send"
        label = group_label(x.axis, x.desc, x.pg, x.ranks) if x.ranks else f"pg {x.pg}"
        x.verdict = (f"{label}: rank {x.absent} never entered the {other} matching rank {x.posted}'s {x.op} #{x.seq} "
                     f"({size_words(x.bytes)}; {x.matched} earlier transfers rank {x.src} -> rank {x.dst} matched); "
                     + (f"rank {x.posted} waits in it since {_clock(x.since_ns)} UTC" if x.waiting else
                        f"rank {x.posted}'s {x.op} completed (entered {_clock(x.since_ns)} UTC): nobody waits in it"))
        if x.absent in inside:
            o = inside[x.absent]
            x.blocked = True
            x.verdict += f"; rank {x.absent} itself waits in {group_label(o.axis, o.desc, o.pg, o.ranks)} {o.next_op} #{o.next_seq}"
        elif x.absent in in_p2p and in_p2p[x.absent] is not x:
            o = in_p2p[x.absent]
            x.blocked = True
            x.verdict += f"; rank {x.absent} itself waits in its {o.op} #{o.seq} (rank {o.src} to rank {o.dst})"
    for g in groups:
        for r in g.missing:
            if r not in inside and r in in_p2p:
                o = in_p2p[r]
                g.blocked = sorted(set(g.blocked) | {r})
                g.verdict += f"; rank {r} itself waits in its {o.op} #{o.seq} (rank {o.src} to rank {o.dst})"


def _latest_words(d: FRDump, groups) -> str:
    """A rank's latest entry in words: where it went silent."""
    if not d.entries:
        return "no entry"
    e = max(d.entries, key=lambda e: e.created_ns)
    g = next((g for g in groups if g.pg == e.pg), None)
    where = group_label(g.axis, g.desc, g.pg, g.ranks) if g else f"pg {e.pg}"
    return (f"{'point-to-point ' if e.p2p else ''}{op_word(e)} #{e.seq} of {where}, entered "
            f"{time.strftime('%H:%M:%S', time.gmtime(e.created_ns / 1e9))} UTC")


def _beside_undumped(rank: int, groups) -> str:
    """A cause that shares a group (not the world) with ranks without a dump may be held by them."""
    shared = [g for g in groups if rank in g.ranks and g.undumped and g.axis != WORLD]
    return "".join(f"; it shares {group_label(g.axis, g.desc, g.pg, g.ranks)} with "
                   f"{'rank' if len(g.undumped) == 1 else 'ranks'} {', '.join(map(str, g.undumped))}, "
                   f"which left no dump" for g in shared)


def flight_record(path: str, strict: bool = False, sizes: Optional[dict] = None,
                  config_path: Optional[str] = None, job_grid=None) -> tuple[Optional[FlightRecord], list[Problem]]:
    """(the analysis, or None when `path` holds no dump; the dumps that could not be read).
    `sizes`, `config_path`: the layout given on the command line (runinputs.RunInputs); `job_grid`:
    the traces' layout (layoutfind.JobLayout), used where the dumps and the sizes given name none."""
    dumps, problems, notes = read_dumps(path, strict)
    fr = analyse_dumps(dumps, _run_facts(path), sizes, config_path, job_grid) if dumps else None
    if fr is not None:
        fr.notes += notes
    return fr, problems


def _run_facts(path: str) -> Optional[dict]:
    """The facts of the run's diag_run.json beside the dumps (or above OUT/flightrec): its world size
    and axis sizes; None where there is none or it does not read (the trace reader reports a bad one)."""
    from ..runmeta import RunMetaError, decode, given
    from ..trace.job import RUN_METADATA

    folder = path if os.path.isdir(path) else os.path.dirname(path)
    for d in (folder, os.path.dirname(folder)) if os.path.basename(folder) in DUMP_FOLDERS else (folder,):
        p = os.path.join(d, RUN_METADATA)
        try:
            if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) < (1 << 20):
                with open(p, "rb") as f:
                    return given(decode(f.read()))
        except (OSError, RunMetaError, ValueError, TypeError):
            return None
    return None


def dumps_only(path: str, fr: Optional[FlightRecord], problems: list[Problem]) -> Diagnosis:
    """The Diagnosis of a folder with Flight Recorder dumps and no profiler trace. With no dump
    readable, the first problem is the error (one line naming the file)."""
    if fr is None:
        raise TraceError(problems[0].file, problems[0].problem)
    return Diagnosis(source=os.path.abspath(path), world_size=fr.world_size, backend=fr.backend, ranks=[], layout=fr.layout,
                     problems=problems, flight_recorder=fr,
                     notes=["no profiler trace here: the report is the Flight Recorder dumps' alone"])
