#!/usr/bin/env python3
"""Build a large, real-looking Kineto trace by repeating a real one K times in time.

The benchmark needs traces of 50 MB and more (uncompressed) and two sizes to show cost is linear
in the number of events; the real traces we may redistribute are 1-15 MB. Concatenating a real
trace with itself keeps everything that makes real traces slow or awkward to parse (names, args,
flow events, float timestamps, memcpy/memset/NCCL kernels, ProfilerStep annotations), unlike a
synthetic generator.

Copy k (0-based) of every event gets:
  * ts + k * shift, where shift = ceil(trace span) + gap (an integer number of microseconds, so
    fractional timestamps keep their fraction);
  * every id that links events (args "External id", "correlation", "Record function id",
    "Sequence number", "Python id", "Python parent id", and the top-level "id" of flow events)
    + k * (largest such id in the source + 1): one offset for all of them, so ids stay unique
    and kernel->launch->op links (including the real-world quirk External id == correlation)
    are preserved;
  * "ProfilerStep#N" (cpu and gpu_user_annotation) renamed to N + k * (number of steps).
Metadata events (ph "M") and instant events are written once (the "Record Window End" marker is
moved to the end), and the whole-trace "Trace" span is stretched to cover all copies. Top-level
keys (deviceProperties, distributedInfo, ...) are kept as they are.

Output is Kineto-like text (one event per line, "key": value spacing, so HTA's rank regex still
matches), as .json or .json.gz depending on OUT's suffix.

    python benchmarks/make_big_trace.py tests/data/a100_rank0_of_2_nccl_args/nccl_data.json.gz \
        /tmp/big_x6.json --copies 6
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import sys
from typing import Any, Dict, List

ID_ARGS = ("External id", "correlation", "Record function id", "Sequence number",
           "Python id", "Python parent id")
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def _load(path: str) -> Dict[str, Any]:
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.endswith((".json", ".gz")))
        if len(files) != 1:
            sys.exit(f"{path}: expected one trace file, found {files}; pass the file")
        path = os.path.join(path, files[0])
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return json.loads(fh.read())


def _max_id(events: List[dict]) -> int:
    m = 0
    for e in events:
        if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
            m = max(m, e["id"])
        args = e.get("args")
        if isinstance(args, dict):
            for k in ID_ARGS:
                v = args.get(k)
                if isinstance(v, int) and not isinstance(v, bool):
                    m = max(m, v)
    return m


def _span(events: List[dict]) -> tuple[float, float]:
    lo, hi = math.inf, -math.inf
    for e in events:
        if e.get("ph") == "X" and e.get("cat") != "Trace":
            ts = e.get("ts")
            if isinstance(ts, (int, float)):
                lo = min(lo, ts)
                hi = max(hi, ts + (e.get("dur") or 0))
    return lo, hi


def _step_count(events: List[dict]) -> int:
    nums = [int(m.group(1)) for e in events
            if isinstance(e.get("name"), str) and (m := STEP_RE.match(e["name"]))]
    return (max(nums) - min(nums) + 1) if nums else 0


def _shift_ts(ts: Any, by: int) -> Any:
    if isinstance(ts, float):
        return round(ts + by, 3)
    if isinstance(ts, int):
        return ts + by
    return ts


def _copy_event(e: dict, k: int, shift: int, id_off: int, nsteps: int) -> dict:
    if k == 0:
        return e
    c = dict(e)
    c["ts"] = _shift_ts(e.get("ts"), k * shift)
    if c.get("ph") in ("s", "f", "t") and isinstance(c.get("id"), int):
        c["id"] = c["id"] + k * id_off
    args = e.get("args")
    if isinstance(args, dict):
        a = dict(args)
        for key in ID_ARGS:
            v = a.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                a[key] = v + k * id_off
        c["args"] = a
    name = c.get("name")
    if nsteps and isinstance(name, str) and (m := STEP_RE.match(name)):
        c["name"] = f"ProfilerStep#{int(m.group(1)) + k * nsteps}"
    return c


def build(trace: Dict[str, Any], copies: int, gap_us: int) -> Dict[str, Any]:
    events = trace["traceEvents"]
    lo, hi = _span(events)
    shift = int(math.ceil(hi - lo)) + gap_us
    id_off = _max_id(events) + 1
    nsteps = _step_count(events)
    once = [e for e in events if e.get("ph") in ("M", "i", "I") or e.get("cat") == "Trace"]
    body = [e for e in events if not (e.get("ph") in ("M", "i", "I") or e.get("cat") == "Trace")]
    head: List[dict] = []
    for e in once:
        c = dict(e)
        if c.get("cat") == "Trace" and isinstance(c.get("dur"), (int, float)):
            c["dur"] = c["dur"] + (copies - 1) * shift
        elif c.get("name") == "Record Window End":
            c["ts"] = _shift_ts(c.get("ts"), (copies - 1) * shift)
        head.append(c)
    meta = {k: v for k, v in trace.items() if k != "traceEvents"}
    # Lazy: the copies are made while writing, so a multi-gigabyte trace never sits in memory.
    meta["traceEvents"] = _Events(head, body, copies, shift, id_off, nsteps)
    return meta, shift, id_off, nsteps


class _Events:
    """The output events, made on iteration (len() without making them)."""

    def __init__(self, head, body, copies, shift, id_off, nsteps):
        self.head, self.body, self.copies, self.args = head, body, copies, (shift, id_off, nsteps)

    def __len__(self) -> int:
        return len(self.head) + self.copies * len(self.body)

    def __iter__(self):
        yield from self.head
        for k in range(self.copies):
            for e in self.body:
                yield _copy_event(e, k, *self.args)


def write(trace: Dict[str, Any], out: str) -> None:
    events = trace.pop("traceEvents")
    head = json.dumps(trace, indent=2)[:-2]  # drop the closing "\n}"
    opener = (lambda p: gzip.open(p, "wt", compresslevel=6)) if out.endswith(".gz") else \
        (lambda p: open(p, "w"))
    with opener(out) as fh:
        fh.write(head + ',\n  "traceEvents": [\n')
        last = len(events) - 1
        for i, e in enumerate(events):
            fh.write("  " + json.dumps(e) + (",\n" if i < last else "\n"))
        fh.write("  ]\n}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="a real trace file (.json/.json.gz) or a folder holding one")
    ap.add_argument("out", help="output path, .json or .json.gz")
    ap.add_argument("--copies", type=int, required=True, help="how many times to repeat it")
    ap.add_argument("--gap-us", type=int, default=1000, help="idle gap between copies (us)")
    args = ap.parse_args(argv)
    if args.copies < 1:
        ap.error("--copies must be >= 1")
    trace = _load(args.src)
    n0 = len(trace["traceEvents"])
    big, shift, id_off, nsteps = build(trace, args.copies, args.gap_us)
    n = len(big["traceEvents"])
    write(big, args.out)
    print(json.dumps({"src": args.src, "out": args.out, "copies": args.copies,
                      "events_src": n0, "events": n, "ts_shift_us": shift,
                      "id_offset": id_off, "steps_per_copy": nsteps,
                      "bytes": os.path.getsize(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
