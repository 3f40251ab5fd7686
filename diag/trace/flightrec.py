"""Flight Recorder dumps: PyTorch's per-rank ring buffer of collectives, read without trusting it.

A job that hangs or slows down an hour in leaves no profiler trace of the moment; PyTorch's Flight
Recorder does (TORCH_FR_BUFFER_SIZE entries per process, dumped per rank on a timeout, on demand
or by `torch._C._distributed_c10d._dump_fr_trace_json()`). A dump is JSON (ours, and
`_dump_fr_trace_json`) or a pickle (the watchdog's default `TORCH_FR_DUMP_TEMP_FILE`
`<prefix><rank>` files). Both hold plain containers only: `version`, `pg_config` (name -> desc and
ranks), `pg_status` (per local pg id: last enqueued / completed sequence number) and `entries`, one
per collective. A pickle is read by an unpickler that refuses every class and callable, so
nothing in the file is ever executed (the standard unpickler is never used); torch's typed-list
markers (torch.jit._pickle.build_intlist ...) become plain lists through diag's own function.

The rank is not in the dump: it is the number at the end of the file name (as PyTorch's fr_trace
reads it). Every malformed field is a TraceError naming the file, the entry and the field.
"""
from __future__ import annotations

import io
import json
import math
import os
import pickle
import re
from dataclasses import field, replace
from typing import Optional

from .errors import TraceError
from .kinds import Coll, coll_from_host_op, dtype_bytes
from ..record import record

MAX_DUMP_BYTES = 1 << 30            # a dump of 20k entries with stacks is tens of MB
DUMP_FOLDERS = ("flightrec", "comm_traces", "fr_traces")   # ours; torchtitan's; a common choice
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")
_JSON_HEAD = re.compile(rb'"(?:entries|pg_status|pg_config)"\s*:')
# Kineto's distributedInfo has a pg_config too: a head with any of a trace's own keys is a trace.
_KINETO_HEAD = re.compile(rb'"(?:traceEvents|schemaVersion|deviceProperties|distributedInfo)"\s*:')
_PICKLE_HEAD = (b"pg_config", b"entries", b"pg_status", b"version")


@record
class FREntry:
    """One collective as one rank recorded it."""

    pg: str                          # the process group's name (unique per group, same on its members)
    desc: str                        # its description: mesh_tp, default_pg, ...
    seq: int                         # collective_seq_id (p2p_seq_id for point-to-point)
    p2p: bool
    op: str                          # profiling_name: nccl:all_reduce, gloo:all_gather, ...
    coll: Coll
    in_nelems: Optional[int]
    out_nelems: Optional[int]
    dtype_bytes: int                 # 0: unknown
    state: str                       # scheduled | started | completed
    created_ns: int                  # when the rank entered (enqueued) it, host clock
    completed_ns: Optional[int]      # None: not recorded (gloo, or timing off)
    duration_s: Optional[float]      # None: not timed (TORCH_NCCL_ENABLE_TIMING, GPU only)
    timeout_s: Optional[float] = None  # the process group's timeout as the entry records it (timeout_ms)


@record
class FRDump:
    """One rank's Flight Recorder dump, as read."""

    path: str
    rank: int
    version: str
    groups: dict = field(default_factory=dict)    # pg name -> (desc, [ranks]) from pg_config; [] unknown
    entries: list[FREntry] = field(default_factory=list)
    reason: Optional[str] = None     # why it was taken (the trainer's diag_dump: failure, SIGUSR1, SIGTERM, end)
    taken_ns: Optional[int] = None   # when (host clock); None: not recorded (torch's own dumps)


def _plain_list(items):
    if not isinstance(items, list):
        raise pickle.UnpicklingError("a typed list that is not a list")
    return list(items)


# torch's C++ pickler writes a typed list (c10::List<int64_t>, ...) as GLOBAL torch.jit._pickle
# build_intlist applied to a plain list: diag's own list builder stands in, torch is never imported.
_TORCH_LISTS = {("torch.jit._pickle", f"build_{t}list") for t in ("int", "double", "bool", "string")}


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers; any class or callable is refused (but
    torch's typed-list markers, which become plain lists here)."""

    def find_class(self, module, name):
        if (module, name) in _TORCH_LISTS:
            return _plain_list
        raise pickle.UnpicklingError(f"it names {module}.{name}; only plain containers are accepted")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it holds a persistent id; only plain containers are accepted")


def is_dump(path: str) -> bool:
    """Does the file look like a Flight Recorder dump (its first bytes, not its name)?"""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if head[:1] == b"\x80":
        return any(k in head for k in _PICKLE_HEAD)
    return head.lstrip()[:1] == b"{" and bool(_JSON_HEAD.search(head)) and not _KINETO_HEAD.search(head)


def dump_files(root: str) -> list[str]:
    """Dump files in `root` itself (those whose content is a dump's, and the files named like them:
    `rank_1` beside the dump `rank_0`, even empty, is rank 1's dump, reported if bad) or in its
    flightrec/comm_traces folders (every file named with a rank: a bad one is then reported, not
    skipped); a file: itself."""
    if os.path.isfile(root):
        return [root] if is_dump(root) else []
    out = []
    for folder in (root, *(os.path.join(root, d) for d in DUMP_FOLDERS)):
        if not os.path.isdir(folder) or (folder != root and os.path.islink(folder)):
            continue
        named = [n for n in sorted(os.listdir(folder)) if _RANK_IN_NAME.search(n) and not n.endswith(".partial")
                 and os.path.isfile(os.path.join(folder, n)) and not os.path.islink(os.path.join(folder, n))]
        if folder == root:
            prefixes = {_RANK_IN_NAME.sub("", n) for n in named if is_dump(os.path.join(folder, n))}
            named = [n for n in named if _RANK_IN_NAME.sub("", n) in prefixes]
        out += [os.path.join(folder, n) for n in named]
    return out


def read_dump(path: str) -> FRDump:
    """One rank's dump; TraceError(path, problem) for anything not a well-formed dump."""
    m = _RANK_IN_NAME.search(os.path.basename(path))
    if not m:
        raise TraceError(path, "no rank number at the end of the file name (PyTorch names dumps <prefix><rank>)")
    raw = load_plain(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("entries", []), list):
        raise TraceError(path, "not a Flight Recorder dump: no 'entries' list at the top")
    dump = FRDump(path, int(m.group(1)), str(raw.get("version", "")), _groups(path, raw.get("pg_config")))
    note = raw.get("diag_dump")
    if isinstance(note, dict):          # the trainer's: why and when (torch's readers ignore the key)
        dump.reason = str(note["reason"]) if isinstance(note.get("reason"), str) else None
        dump.taken_ns = note["time_ns"] if _is_int(note.get("time_ns")) and note["time_ns"] > 0 else None
    dump.entries = fold_coalesced([_entry(path, i, e) for i, e in enumerate(raw.get("entries", []))])
    return dump


def fold_coalesced(entries: list[FREntry]) -> list[FREntry]:
    """One entry per coalesced collective: it is recorded as its parts and a closing `coalesced` entry,
    one after another in their group, all with one collective_seq_id (fr_trace treats them as one). The
    fold: the parts' op when they agree (else 'coalesced'), their elements summed, the closing
    entry's state, completion and duration, the first part's entry time. Point-to-point entries are
    never folded: each send/recv of a batch is matched with its peer's (analysis.frp2p)."""
    last: dict = {}              # pg -> index of its latest group: parts follow one another in their pg
    batch: dict = {}             # pg -> indices of the p2p entries since its last closing entry
    out: list = []
    for e in entries:
        if e.p2p:                # a batch of sends/recvs (batch_isend_irecv) stays its ops: each is matched with its peer
            batch.setdefault(e.pg, []).append(len(out))
            out.append([e])
            continue
        if batch.get(e.pg) and _closes(e):
            _close_p2p(out, batch.pop(e.pg), e)
            continue
        i = last.get(e.pg)
        if i is not None and (out[i][0].p2p, out[i][0].seq) == (e.p2p, e.seq):
            out[i].append(e)
        else:
            last[e.pg] = len(out)
            out.append([e])
    return [g[0] if len(g) == 1 else _fold(g) for g in out]


def _closes(e: FREntry) -> bool:
    return e.op.split(":")[-1].split(" ")[0] == "coalesced"


def _close_p2p(out: list, parts: list, closer: FREntry) -> None:
    """A batch of sends/recvs closed by a `coalesced` entry that NCCL records as no p2p (torch
    2.11, NCCL 2.28 on an H100: is_p2p false, collective_seq_id 0, so taken for a collective it
    was matched by that 0 with every other batch's closer). The batch ran as one NCCL operation:
    its parts stay `scheduled` in the dump and only the closer records the state, completion and
    duration; each part takes them, and the closer goes with the parts as a p2p entry
    (analysis.frp2p skips closers)."""
    for i in parts:
        e = out[i][0]
        if e.state == "scheduled" and closer.state != "scheduled":
            out[i][0] = replace(e, state=closer.state, completed_ns=closer.completed_ns,
                                duration_s=closer.duration_s)
    out.append([replace(closer, p2p=True)])


def _fold(group: list[FREntry]) -> FREntry:
    parts = [e for e in group if not e.op.split(" ")[0].endswith("coalesced")] or group   # not the closer
    last = group[-1]
    colls = {e.coll for e in parts}
    one = len(colls) == 1

    def total(xs):
        return None if any(x is None for x in xs) else sum(xs)

    durs = [e.duration_s for e in group if e.duration_s is not None]
    return FREntry(pg=last.pg, desc=last.desc, seq=last.seq, p2p=last.p2p,
                   op=parts[0].op if one else last.op, coll=parts[0].coll if one else Coll.UNKNOWN,
                   in_nelems=total([e.in_nelems for e in parts]), out_nelems=total([e.out_nelems for e in parts]),
                   dtype_bytes=parts[0].dtype_bytes if len({e.dtype_bytes for e in parts}) == 1 else 0,
                   state=last.state, created_ns=min(e.created_ns for e in group),
                   completed_ns=last.completed_ns, duration_s=max(durs) if durs else None, timeout_s=last.timeout_s)


def load_plain(path: str):
    """The dump's plain containers (dicts, lists, strings, numbers), JSON or pickle; TraceError else."""
    try:
        size = os.path.getsize(path)
        if size > MAX_DUMP_BYTES:
            raise TraceError(path, f"{size} bytes, more than a Flight Recorder dump holds ({MAX_DUMP_BYTES})")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if not data.strip():
        raise TraceError(path, "empty file: the dump was never written (the rank died or was killed while dumping)")
    if data[:1] == b"\x80":
        try:
            return _PlainUnpickler(io.BytesIO(data)).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
                AttributeError, RecursionError, OverflowError, MemoryError) as e:
            raise TraceError(path, f"pickle refused: {e}") from None
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise TraceError(path, f"not valid JSON ({e}): truncated or not a dump") from None


def _groups(path: str, pg_config) -> dict:
    """pg name -> (desc, ranks). PyTorch writes {name: {name, desc, ranks: "[0, 1]"}}; older dumps
    and other writers give the ranks as a list, or a group as its ranks alone ({name: [0, 1]})."""
    if pg_config is None:
        return {}
    if not isinstance(pg_config, dict):
        raise TraceError(path, "pg_config is not a mapping of group name to its description and ranks")
    out = {}
    for name, g in pg_config.items():
        if isinstance(g, (list, tuple, str)):      # old style: the group's ranks alone
            g = {"ranks": g}
        if not isinstance(g, dict):
            raise TraceError(path, f"pg_config[{name!r}] is not a mapping")
        ranks = g.get("ranks", [])
        if isinstance(ranks, str):            # PyTorch writes "[0, 1]" as a string
            try:
                ranks = json.loads(ranks) if ranks.strip() else []
            except ValueError:
                raise TraceError(path, f"pg_config[{name!r}].ranks is {ranks[:40]!r}, not a list of ranks") from None
        if isinstance(ranks, (list, tuple)):
            ranks = [int(r) if isinstance(r, str) and r.isdigit() else r for r in ranks]
        if not isinstance(ranks, (list, tuple)) or not all(_is_int(r) and r >= 0 for r in ranks):
            raise TraceError(path, f"pg_config[{name!r}].ranks is not a list of ranks")
        if name:                               # gloo writes one empty placeholder
            out[str(name)] = (str(g.get("desc") or ""), sorted(set(ranks)))
    return out


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


_INT64_END = 1 << 63


def _int(path: str, i: int, e: dict, key: str, required: bool = True) -> Optional[int]:
    v = e.get(key)
    if v is None and not required:
        return None
    if isinstance(v, str) and v.lstrip("-").isdigit():
        v = int(v)
    if not _is_int(v):
        raise TraceError(path, f"entry {i}: {key} is {v!r:.40}, not an integer")
    if not 0 <= v < _INT64_END:          # sequence numbers and ns clocks: past int64 is damage
        raise TraceError(path, f"entry {i}: {key} is {v!r:.40}, not an integer from 0 to 2^63")
    return v


def _nelems(path: str, i: int, sizes) -> Optional[int]:
    """Elements over the entry's tensors; None when not recorded."""
    if sizes is None:
        return None
    if not isinstance(sizes, list) or not all(isinstance(s, list) and all(_is_int(d) and d >= 0 for d in s)
                                              for s in sizes):
        raise TraceError(path, f"entry {i}: input/output sizes are not lists of dimensions")
    n = sum(math.prod(s) for s in sizes)
    return n if 0 < n < _INT64_END else None          # past int64 elements: the size is unknown


def _entry(path: str, i: int, e) -> FREntry:
    if not isinstance(e, dict):
        raise TraceError(path, f"entry {i} is not a mapping")
    pg = e.get("process_group")
    if not (isinstance(pg, (list, tuple)) and len(pg) == 2 and all(isinstance(x, str) for x in pg)):
        raise TraceError(path, f"entry {i}: process_group is {pg!r:.60}, not [name, description]")
    name = e.get("profiling_name")
    if not isinstance(name, str):
        raise TraceError(path, f"entry {i}: profiling_name is {name!r:.40}, not a string")
    coll = coll_from_host_op(name.split(" ")[0])
    # older dumps have no is_p2p: a send/recv is point-to-point by its name
    p2p = bool(e.get("is_p2p", coll in (Coll.SEND, Coll.RECV)))
    seq = _int(path, i, e, "p2p_seq_id" if p2p and "p2p_seq_id" in e else "collective_seq_id")
    created = _int(path, i, e, "time_created_ns")
    done = _int(path, i, e, "time_discovered_completed_ns", required=False)
    dur = e.get("duration_ms")
    if dur is not None and (not isinstance(dur, (int, float)) or isinstance(dur, bool) or not dur >= 0):
        raise TraceError(path, f"entry {i}: duration_ms is {dur!r:.40}, not a duration")
    tmo = e.get("timeout_ms")
    tmo = tmo / 1e3 if isinstance(tmo, (int, float)) and not isinstance(tmo, bool) and tmo > 0 else None
    dtypes = e.get("input_dtypes") or e.get("output_dtypes") or []
    return FREntry(pg=pg[0], desc=pg[1], seq=seq, p2p=p2p, op=name, coll=coll,
                   in_nelems=_nelems(path, i, e.get("input_sizes")),
                   out_nelems=_nelems(path, i, e.get("output_sizes")),
                   dtype_bytes=dtype_bytes(dtypes[0]) if isinstance(dtypes, list) and dtypes else 0,
                   state=str(e.get("state", "")), created_ns=created, completed_ns=done or None,
                   duration_s=None if dur is None else dur / 1e3, timeout_s=tmo)
