"""One rank's trace file copied onto the job's timeline, event by event, a chunk at a time.

Problem: a Perfetto / chrome://tracing file of the whole job holds every rank's events, and a
job's traces can be gigabytes: the copy must not hold a rank (let alone the job) as Python
objects. The events are decoded a few MB at a time (trace.schema's chunk cuts) and written out
at once. Each event keeps everything it had (name, cat, args, ids, flow phases); what changes:
- pid becomes the rank, and the rank's (pid, tid) pairs (host threads, GPU streams) become small
  tids of that one process, named after the original thread and process ("GPU 0 / stream 7");
- ts moves by the rank's clock offset (analysis.clocks), so the ranks share one time axis;
- ids of flows and async events are made unique across ranks (each rank's Kineto numbers
  them from its own counter, and Perfetto would join rank 0's flow 5 with rank 1's).
The original metadata events (process and thread names, sort indexes) are replaced by these.
Where a slice is one of the rank's matched collectives, the flow events that link it to its
peers (report.timeline) are written beside it, bound to it by its own pid, tid and time.
"""
from __future__ import annotations

from dataclasses import field
from typing import Callable, Iterator

import msgspec

from ..trace import schema
from ..trace.errors import TraceError
from ..trace.read import decode_trace, read_bytes, release
from ..record import record

_decode_events = msgspec.json.Decoder(list[dict])
_encode = msgspec.json.Encoder()
_NAMING = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}
_IDS = frozenset("sftbenSTFpON")          # phases whose id joins events: flows, async, objects


@record
class Copied:
    """What copying one rank did, for the trace's metadata and the stderr note."""

    events: int = 0                       # events written (metadata events not counted)
    dropped: int = 0                      # events with no numeric timestamp: left out
    flows_placed: int = 0                 # its matched collectives found and linked to their peers
    threads: dict = field(default_factory=dict)   # (pid, tid) of the file -> tid written


def _dict_chunks(path: str, array) -> Iterator[list[dict]]:
    """The raw events as dicts, about schema.CHUNK_BYTES at a time."""
    try:
        if len(memoryview(array)) <= 2 * schema.CHUNK_BYTES:
            yield _decode_events.decode(memoryview(array))
            return
        for start, stop in schema.chunk_ranges(array):
            yield _decode_events.decode(schema.json_array(memoryview(array)[start:stop]))
            release(array, start, stop)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
        raise TraceError(path, f"events could not be decoded for the timeline: {e}") from None


def _names(meta: list[dict]) -> tuple[dict, dict, dict]:
    """From the file's metadata events: process names, thread names, sort indexes."""
    procs, threads, order = {}, {}, {}
    for e in meta:
        a = e.get("args") if isinstance(e.get("args"), dict) else {}
        key, name = (e.get("pid"), e.get("tid")), e.get("name")
        if name == "process_labels" and isinstance(a.get("labels"), str):
            procs[key[0]] = a["labels"]
        elif name == "process_name" and isinstance(a.get("name"), str):
            procs.setdefault(key[0], a["name"])
        elif name == "thread_name" and isinstance(a.get("name"), str):
            threads[key] = a["name"]
        elif name == "thread_sort_index" and isinstance(a.get("sort_index"), (int, float)):
            order[key] = a["sort_index"]
    return procs, threads, order


def thread_metadata(rank: int, copied: Copied, meta: list[dict]) -> list[dict]:
    """thread_name and thread_sort_index of each tid written, in the file's order of threads."""
    procs, threads, order = _names(meta)
    out = []
    ranked = sorted(copied.threads.items(), key=lambda kv: (str(procs.get(kv[0][0], "")).startswith("GPU"),
                                                            str(kv[0][0]), order.get(kv[0], 0), str(kv[0][1])))
    for i, ((pid, tid), new) in enumerate(ranked):
        tname = str(threads.get((pid, tid)) or "").strip() or f"thread {tid}"
        pname = str(procs.get(pid) or "").strip()
        name = f"{pname} / {tname}" if pname and pname != tname else tname
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": new, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": new, "args": {"sort_index": i}})
    return out


def _new_id(old, rank: int, stride: int):
    if isinstance(old, int) and not isinstance(old, bool):
        return old * stride + rank
    return f"r{rank}:{old}"


def _moved(e: dict, rank: int, shift_us: float, stride: int, copied: Copied) -> bool:
    """Move one (non-metadata) event onto the rank's process and the shared axis, in place;
    False when it has no numeric timestamp to move."""
    ts = e.get("ts")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return False
    key = (e.get("pid"), e.get("tid"))
    if not (isinstance(key[0], (int, str)) and isinstance(key[1], (int, str))):
        key = (None, None)
    e["pid"], e["tid"], e["ts"] = rank, copied.threads.setdefault(key, len(copied.threads) + 1), ts + shift_us
    if "id" in e and e.get("ph") in _IDS:
        e["id"] = _new_id(e["id"], rank, stride)
    if e.get("ph") == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
        e["dur"] = 0                      # as the analysis counts it (trace.build)
    return True


def copy_rank(path: str, rank: int, shift_us: float, stride: int, write: Callable[[bytes], None],
              flows_at: Callable[[float, dict], list[dict]]) -> tuple[Copied, list[dict]]:
    """Write rank `rank`'s events from `path`; (what was done, its metadata events for naming).
    flows_at(ts in the file, event as written): the flow events to write beside it (none for most).
    Each chunk is encoded in one call: per-event encoding and writing cost as much as the rest."""
    doc = decode_trace(path, read_bytes(path))
    copied, meta = Copied(), []
    for chunk in _dict_chunks(path, doc.traceEvents):
        out = []
        for e in chunk:
            if e.get("ph") == "M":
                if e.get("name") in _NAMING:
                    meta.append(e)
                continue
            ts = e.get("ts")
            if not _moved(e, rank, shift_us, stride, copied):
                copied.dropped += 1
                continue
            out.append(e)
            copied.events += 1
            links = flows_at(ts, e)
            out += links
            copied.flows_placed += bool(links)
        if out:
            write(_encode.encode(out)[1:-1])
    return copied, meta
