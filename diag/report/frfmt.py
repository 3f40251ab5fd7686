"""The Flight Recorder part of a report, as lines and table rows every renderer shares."""
from __future__ import annotations

import time

from ..analysis.hang import size_words
from .fmt import ms

FR_TIMING_HEADER = ["collective", "n", "calls", "size", "xfer ms", "p95 ms", "wait ms", "busbw"]


def _clock(ns) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9)) + " UTC" if ns else "-"


def fr_headline(fr) -> list[str]:
    span = (fr.last_ns - fr.first_ns) / 1e9 if fr.first_ns is not None else 0.0
    return [f"Flight Recorder: {len(fr.ranks)} rank dumps, {fr.entries:,} entries, "
            f"{_clock(fr.first_ns)} to {_clock(fr.last_ns)} ({span:,.1f} s)",
            f"Groups named by: {fr.layout}" if fr.layout else "Groups named by: unknown (no group descriptions)"] \
        + ([f"missing dumps: no dump of rank{'s' * (len(fr.undumped) > 1)} {', '.join(map(str, fr.undumped))} "
            f"(world size {fr.world_size}{'' if fr.world_known else ' at least'}): "
            f"{'its' if len(fr.undumped) == 1 else 'their'} state is unknown; the groups are judged without "
            f"{'it' if len(fr.undumped) == 1 else 'them'}"] if fr.undumped else [])


def _secs(s) -> str:
    return f"{s:,.1f} s" if s is not None else "unknown"


def verdict_head(fr) -> list[str]:
    """What the stuck lines are: a hang or a snapshot of ranks in flight (analysis.flightrec._judge),
    with the wait and the timeout it is judged by."""
    wait = (f"the longest wait {'at least ' if fr.wait_is_lower_bound else ''}{_secs(fr.longest_wait_s)}"
            + (" (to the buffers' last entry: no dump time recorded)" if fr.wait_is_lower_bound else ""))
    tmo = f"the process group timeout {_secs(fr.timeout_s)}" if fr.timeout_s else "no timeout recorded"
    if fr.verdict_kind == "snapshot":
        return [f"snapshot ({fr.taken}): in flight, not a hang yet: ranks mid-collective when the dumps were taken; "
                f"{wait}, under {tmo} (waits that outlast it are a hang: dump again)"]
    why = (f"dumps taken {fr.taken}" if fr.taken else "no dump reason recorded (torch's watchdog dumps on a "
           "timeout; a dump taken on request can catch ranks mid-collective)")
    if fr.longest_wait_s is None:          # nobody waits (ops or sizes that differ): no wait to judge
        return [f"hang: {why}"]
    return [f"hang: {why}; {wait}, {tmo}"]


def hang_lines(fr) -> list[str]:
    """The stuck groups first, one line each; 'no hang' when every group is in step."""
    stuck = fr.hangs
    if not stuck:
        return ["no hang: in every group, every dumped member entered the same last collective"
                + (f" (dumps taken {fr.taken})" if fr.taken else "")]
    word = "in flight" if fr.verdict_kind == "snapshot" else "hang"
    head = ([f"{word}: the others wait for {'rank' if len(fr.cause) == 1 else 'ranks'} "
             f"{', '.join(map(str, fr.cause))}, which wait{'s' * (len(fr.cause) == 1)} in no collective"
             + (f" (latest entry: {fr.cause_last[0]})" if len(fr.cause) == 1 and fr.cause_last else "")]
            if fr.cause else [])
    return verdict_head(fr) + head + [f"{word}: {g.verdict}" for g in stuck]


def late_lines(fr) -> list[str]:
    if fr.late_unknown:
        return [f"late ranks: cannot tell ({fr.late_unknown})"]
    if not fr.late:
        return ["late ranks: none (no rank made the others wait 100 ms per s of run or more in two windows of the buffer)"]
    return [f"late: rank {x.rank} from {_clock(x.since_ns)}" + (f" to {_clock(x.until_ns)}" if x.until_ns else "")
            + f": {x.evidence}" for x in fr.late]


def fr_timing_rows(fr) -> list[list[str]]:
    return [[f"{t.axis}:{t.op}", str(t.group_size), f"{t.instances:,}", size_words(t.median_bytes) if t.median_bytes is not None else "-",
             ms(t.transfer_median_s, 3), ms(t.transfer_p95_s, 3), ms(t.wait_median_s, 3),
             f"{t.busbw_median_gbps:.2f}" if t.busbw_median_gbps is not None else "-"] for t in fr.timings]


def fr_timing_legend(fr) -> str:
    why = sorted({t.unknown for t in fr.timings if t.unknown})
    return ("Matched across each group by sequence number; transfer = the shortest member's duration; "
            "wait = a member's excess over it (medians); size: median message; busbw GB/s per nccl-tests." + "".join(f" '-': {w}." for w in why))


def fr_lines(fr) -> list[str]:
    """Everything but the timing table, in reading order."""
    return fr_headline(fr) + hang_lines(fr) + late_lines(fr) + [f"note: {n}" for n in fr.notes]
