"""The slice of the Kineto Chrome-trace JSON that diag reads, as msgspec structs.

Decoding straight into typed structs skips every field we do not name (most of a
trace's bytes are args nobody analyses), keeps memory near the size of the data we
use, and turns a wrong type into an error that names the JSON path. Fields whose type
varies across PyTorch versions are typed ``Any`` and coerced later, so a new schema
never makes a whole file unreadable.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterator, Union

import msgspec


class Args(msgspec.Struct, omit_defaults=True, gc=False):
    """The `args` keys diag uses; every other key is skipped by the decoder."""

    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    stream: Any = None
    device: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    concrete: Any = msgspec.field(default=None, name="Concrete Inputs")  # c10d::send/recv_: the peer
    name: Any = None  # metadata events: process_name / thread_name
    labels: Any = None  # metadata events: process_labels ("CPU", "GPU 0")


class IdArgs(msgspec.Struct, gc=False):
    """The four id columns of Args, as GPU activity and launches write them (integers, -1 when
    absent): decoded for every such row (decode_ids_many), where the full Args, with its Any
    fields, are decoded only for the communication rows. Any other type fails validation and
    the caller reads these rows as Args instead."""

    external_id: int = msgspec.field(default=-1, name="External id")
    correlation: int = -1
    stream: int = -1
    device: int = -1


class Event(msgspec.Struct, gc=False):
    # Typed loosely on purpose: one event of an odd type must not make a whole file
    # unreadable. chunks.py coerces these in bulk (fast when the types are the usual ones)
    # and drops, and counts, the events it cannot read.
    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    # Kept undecoded (a slice of the file's bytes): most of a trace's bytes are the args of
    # CPU ops that no analysis reads. decode_args() parses the few rows that need them.
    args: msgspec.Raw = msgspec.Raw()


class TypedEvent(msgspec.Struct, gc=False, tag="X", tag_field="ph"):
    """A complete ("X") event as nearly every trace writes it: decoded first, so that chunks.py
    can turn the fields into columns without checking each value's type. A chunk with any other
    type in these fields, or a phase not in PHASES, fails validation and is decoded again as
    loosely typed Events. The phase is the struct's tag: read it as PHASE_OF[type(event)]."""

    cat: str = ""
    name: str = ""
    ts: float = math.nan
    dur: float = math.nan
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    args: msgspec.Raw = msgspec.Raw()


class MetaEvent(msgspec.Struct, gc=False, tag="M", tag_field="ph"):
    """Metadata ("M"): process and thread names, as Event has them."""

    name: Any = ""
    pid: Any = None
    tid: Any = None
    args: msgspec.Raw = msgspec.Raw()


class InstantEvent(msgspec.Struct, gc=False, tag="i", tag_field="ph"):
    """An instant ("i"): the profiler's `[memory]` allocator events (profile_memory=True) are
    read (memevents); other instants are marks, nothing to report."""

    name: Any = ""
    ts: Any = None
    args: msgspec.Raw = msgspec.Raw()


class MemoryArgs(msgspec.Struct, gc=False):
    """The args of a `[memory]` instant: the allocator's running total after the event."""

    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    device_type: Any = msgspec.field(default=None, name="Device Type")     # c10::DeviceType: 0 CPU, 1 CUDA
    device_id: Any = msgspec.field(default=None, name="Device Id")


# The other phases of the Chrome trace format: flows, counters, async spans... Nothing of them
# is analysed, so nothing is decoded but their phase (a third of Kineto's events are flow
# arrows: building their fields cost a fifth of the decoding).
PHASES = "BEICbnestfPNODVvRc()"
_OTHER = [msgspec.defstruct(f"Phase{ord(p)}", [], tag=p, tag_field="ph", gc=False) for p in PHASES]
PHASE_OF = {TypedEvent: "X", MetaEvent: "M", InstantEvent: "i", **{cls: p for cls, p in zip(_OTHER, PHASES)}}
_TypedAny = Union[tuple(PHASE_OF)]


class EventList(list):
    """A chunk's decoded events, and how many of its array's items were no readable event
    (not an object, or a number past float64's range): those are left out and counted."""

    unreadable = 0


# The top-level keys diag reads. Each is kept raw first and decoded on its own (header()), so
# one unreadable value (a number past float64's range) makes that key unknown, not the file.
HEADER_KEYS = ("distributedInfo", "deviceProperties", "trace_id", "schemaVersion", "baseTimeNanoseconds", "host_name")


class _RawHeader(msgspec.Struct):
    traceEvents: msgspec.Raw = msgspec.Raw()
    distributedInfo: msgspec.Raw = msgspec.Raw()
    deviceProperties: msgspec.Raw = msgspec.Raw()
    trace_id: msgspec.Raw = msgspec.Raw()
    schemaVersion: msgspec.Raw = msgspec.Raw()
    baseTimeNanoseconds: msgspec.Raw = msgspec.Raw()
    host_name: msgspec.Raw = msgspec.Raw()


class TraceFile(msgspec.Struct):
    # The events stay raw here; event_chunks() decodes them a few MB at a time so that only
    # one chunk's Python objects are alive at once.
    traceEvents: msgspec.Raw = msgspec.Raw()      # empty when the key is absent
    distributedInfo: Any = None
    deviceProperties: Any = None
    trace_id: Any = None
    schemaVersion: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None                          # Kineto's since 2024: the host the rank ran on
    unreadable: list = msgspec.field(default_factory=list)   # HEADER_KEYS whose value could not be read


_event_decoder = msgspec.json.Decoder(Event)
_events_decoder = msgspec.json.Decoder(list[Event])
_typed_decoder = msgspec.json.Decoder(list[_TypedAny])
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_header_decoder = msgspec.json.Decoder(_RawHeader)
NO_ARGS = Args()
CHUNK_BYTES = 4 << 20
_FOLIO = 2 << 20              # the largest page-cache folio a fault maps at once (x86-64)
# Between two events of the array: "}" , "{" with any whitespace. Such a cut inside a nested
# value leaves brackets unbalanced, so a wrong cut fails to decode instead of passing silently.
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def json_array(body) -> bytes:
    """b"[" + body + b"]" in one copy. Each + makes a new bytes object: two copies of a chunk's
    megabytes, the second in a fresh allocation whose pages fault in (~2 ms of a 4 MB chunk's
    ~20 ms of decoding), where one join copies once."""
    return b"".join((b"[", body, b"]"))


def decode_args(raw, typ: type = Args):
    """Parse one event's args (an Args, or typ); malformed or non-object args read as empty (never fatal)."""
    if not raw or raw == b"null":
        return _EMPTY[typ]
    try:
        return _one_decoder[typ].decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        return _EMPTY[typ]


_EMPTY = {Args: NO_ARGS, MemoryArgs: MemoryArgs()}
_one_decoder = {t: msgspec.json.Decoder(t) for t in _EMPTY}
_list_decoder = {t: msgspec.json.Decoder(list[Union[t, None]]) for t in _EMPTY}


def decode_args_many(raws: list, typ: type = Args) -> list:
    """Parse many events' args (Args, or typ: MemoryArgs) in one call; per event only if one of
    them is malformed."""
    if not raws:
        return []
    try:
        out = _list_decoder[typ].decode(json_array(b",".join(r if len(r) else b"null" for r in raws)))
        return [_EMPTY[typ] if a is None else a for a in out]
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, RecursionError, UnicodeDecodeError):
        return [decode_args(r, typ) for r in raws]


_ids_decoder = msgspec.json.Decoder(list[IdArgs])


def decode_ids_many(raws: list) -> "list[IdArgs] | None":
    """Many events' args as IdArgs in one call; None if any of them is absent, null, malformed
    or has an id that is no integer (the caller then decodes them as Args)."""
    if not all(raws):                       # an event without args: the caller's loose path
        return None
    try:
        return _ids_decoder.decode(json_array(b",".join(raws)))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        return None


_NON_SPACE = re.compile(rb"\S")


def first_byte(data) -> "bytes | None":
    """The first non-whitespace byte, without copying the buffer (None if there is none)."""
    m = _NON_SPACE.search(data)
    return data[m.start():m.start() + 1] if m else None


def decode(data: bytes, split: bool = False) -> TraceFile:
    """Decode the file's top level; raises msgspec.DecodeError / ValidationError on bad input.

    split: try decode_split first (a big mapped file), so that the events' bytes are not read
    here; they are decoded, and so checked, chunk by chunk."""
    if first_byte(data) == b"[":            # a Chrome trace may be a bare array of events
        msgspec.json.decode(data, type=list[msgspec.Raw])   # validate it is well-formed
        return TraceFile(traceEvents=msgspec.Raw(data))
    doc = decode_split(data) if split else None
    return doc if doc is not None else header(_header_decoder.decode(data))


def header(raw: _RawHeader) -> TraceFile:
    """The top-level keys decoded one by one: a value that fails validation (a number past
    float64's range anywhere in it) leaves that key unknown and is listed in `unreadable`."""
    doc = TraceFile(traceEvents=raw.traceEvents)
    for key in HEADER_KEYS:
        value = getattr(raw, key)
        if len(value):
            try:
                setattr(doc, key, msgspec.json.decode(value))
            except msgspec.ValidationError:
                doc.unreadable.append(key)
    return doc


_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_LAST_NON_SPACE = re.compile(rb"\S\s*\Z")
HEAD_SCAN = 64 << 20           # the keys before the events (distributedInfo, deviceProperties)
TAIL_SCAN = 1 << 20            # and after them (INFO logs, traceName, baseTimeNanoseconds, ...)
END_WINDOW = 1 << 20           # the last events before a candidate end, decoded to check it
MAX_TAIL_TRIES = 4096


def _is_object_rest(rest: bytes) -> bool:
    """rest is what may follow a value inside an object, up to its end: `}` or `, "k": v ... }`."""
    rest = rest.strip()
    if rest == b"}":
        return True
    if not rest.startswith(b","):
        return False
    try:
        return isinstance(msgspec.json.decode(b"{" + rest[1:]), dict)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return False


def _ends_events(buf: memoryview, open_at: int, close_at: int) -> bool:
    """Whether buf[close_at] == "]" can close the events array opened at open_at: what precedes
    it is an event's "}" (or the "[" itself), and the last events before it decode as an array."""
    before = _LAST_NON_SPACE.search(buf, max(open_at, close_at - 64), close_at)
    if before is None or buf[before.start()] not in b"}[":
        return False
    if before.start() == open_at:
        return True                                        # an empty array
    lo = max(open_at + 1, close_at - END_WINDOW)
    cut = None
    for cut in _BOUNDARY.finditer(buf, lo, close_at):
        pass
    first = cut.end() - 1 if cut is not None else (open_at + 1 if lo == open_at + 1 else None)
    if first is None:
        return False                                       # one event longer than the window
    try:
        msgspec.json.decode(json_array(buf[first:close_at]), type=list[msgspec.Raw])
        return True
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return False


def decode_split(data) -> "TraceFile | None":
    """The top level of a trace without reading its events: the bytes before the events array
    and after it are decoded with an empty array in its place, and traceEvents is the array's
    slice of data. Scanning the whole file here would bring every page of a mapped 2 GB trace
    into memory at once; the chunked decoding reads (and then drops) a few MB at a time.
    The array's end is found from the file's end: the last "]" that closes a run of events and
    is followed by the rest of the top-level object. None when the layout is not the usual one:
    the caller then decodes the whole document (and does so too if the events then fail)."""
    buf = memoryview(data)
    m = _EVENTS_KEY.search(buf, 0, min(len(buf), HEAD_SCAN))
    if m is None:
        return None
    open_at = m.end() - 1
    tail_from = max(m.end(), len(buf) - TAIL_SCAN)
    tail = bytes(buf[tail_from:])
    pos = len(tail)
    for _ in range(MAX_TAIL_TRIES):
        pos = tail.rfind(b"]", 0, pos)
        if pos < 0:
            return None
        if _ends_events(buf, open_at, tail_from + pos) and _is_object_rest(tail[pos + 1:]):
            break
    else:
        return None
    try:
        doc = _header_decoder.decode(bytes(buf[:open_at]) + b"[]" + tail[pos + 1:])
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        return None
    if bytes(doc.traceEvents) != b"[]":       # the key was not the top level's, or came twice
        return None
    doc.traceEvents = msgspec.Raw(buf[open_at:tail_from + pos + 1])
    return header(doc)


def chunk_ranges(array) -> list[tuple[int, int]]:
    """Byte ranges [start, stop) of the array's content, cut between events about every
    CHUNK_BYTES. A cut that falls inside an event shows up when that range fails to decode."""
    from .mapped import release

    buf = memoryview(array)
    start = bytes(buf[:64]).index(b"[") + 1
    end = len(buf) - bytes(buf[-64:])[::-1].index(b"]") - 1
    ranges, pos = [], start
    while pos < end:
        m = _BOUNDARY.search(buf, pos + CHUNK_BYTES, end) if pos + CHUNK_BYTES < end else None
        stop = m.start() + 1 if m else end
        ranges.append((pos, stop))
        # In a mapped file each search faults in a page, or a whole large folio (2 MB) of a file
        # just written, as the inflated gzip is: let it go, or the cuts alone map half the file.
        release(array, pos, min(end, (m.end() if m else end) + _FOLIO))
        pos = m.end() - 1 if m else end
    return ranges


def decode_events(buf) -> list:
    """A JSON array of events: TypedEvents when every event has the usual types, else Events;
    items that are no readable event (null, a number, a value past float64's range) are left
    out and counted (EventList.unreadable). Raises msgspec.DecodeError on malformed JSON, and
    ValidationError when no item at all is an event."""
    try:
        return _typed_decoder.decode(buf)
    except msgspec.ValidationError:
        pass
    try:
        return _events_decoder.decode(buf)
    except msgspec.ValidationError as e:
        problem = e
    out = EventList()
    for raw in _raw_list_decoder.decode(buf):      # rare: one item at a time
        try:
            out.append(_event_decoder.decode(raw))
        except msgspec.ValidationError:
            out.unreadable += 1
    if out.unreadable and not out:
        raise problem                   # not one event: no trace (`[1, 2, 3]`), say why
    return out


def decode_range(array, start: int, stop: int) -> list:
    return decode_events(json_array(memoryview(array)[start:stop]))


def event_chunks(array, chunked: bool = True) -> Iterator[list]:
    """Decode a raw JSON array of events in chunks of about CHUNK_BYTES (or whole)."""
    if not chunked or len(memoryview(array)) <= 2 * CHUNK_BYTES:
        yield decode_events(memoryview(array))
        return
    from .mapped import release

    done = 0
    try:
        for start, stop in chunk_ranges(array):
            chunk = decode_range(array, start, stop)
            release(array, start, stop)
            done += len(chunk)
            yield chunk
    except (msgspec.DecodeError, msgspec.ValidationError):
        if done:
            raise ChunkingError(done) from None
        yield decode_events(memoryview(array))   # one whole decode: raises with the exact problem


_EMPTY_ARRAY = re.compile(rb"\s*(\[\s*\]|null)\s*")


def is_empty_array(raw) -> bool:
    """[] or null, with any whitespace (no copy of the buffer)."""
    return _EMPTY_ARRAY.fullmatch(memoryview(raw)) is not None


class ChunkingError(Exception):
    """A chunk cut did not fall between events after some chunks were already consumed."""

    def __init__(self, consumed: int) -> None:
        super().__init__(f"chunked decoding failed after {consumed} events")
        self.consumed = consumed
