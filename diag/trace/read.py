"""Reading a trace file's bytes: plain or gzip JSON, with errors a user can act on.

Reading needs no numpy and no decoder: they are imported where used, so that a file can be read
ahead (prefetch) while they are imported.
"""
from __future__ import annotations

import mmap
import os
import zlib

try:        # ISA-L's inflate: zlib's API, 3-4x its speed (a wheel on Linux x86-64 and aarch64)
    from isal import isal_zlib as _inflate
except ImportError:            # pragma: no cover (a platform without isal's wheel): the stdlib's
    _inflate = zlib

from . import prefetch
from .mapped import MAP_MIN_BYTES, is_mapped, register as _register, release  # noqa: F401 (re-exported)
from .safeio import open_regular, read_bounded
from .errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"


def _map(f) -> "mmap.mmap | None":
    try:
        if os.fstat(f.fileno()).st_size < MAP_MIN_BYTES or f.read(2) == GZIP_MAGIC:
            return None
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None                       # not mappable (a pipe, a special file): read it
    return _register(mm)


def spill_dir() -> str:
    """Where big gzip traces are inflated: DIAG_TMPDIR, else the system's temporary directory."""
    import tempfile                   # here: ~4 ms to import, for the traces that spill only

    return os.environ.get("DIAG_TMPDIR") or tempfile.gettempdir()


class _Inflated:
    """Where a gzip trace inflates to: memory while small; past MAP_MIN_BYTES an unlinked
    temporary file (DIAG_TMPDIR, else the system's), mapped like a big plain trace, so a trace
    that inflates to gigabytes is not held in the process's memory whole."""

    def __init__(self, path: str) -> None:
        self.path, self.pieces, self.file, self.size = path, [], None, 0

    def write(self, piece: bytes) -> None:
        self.size += len(piece)
        try:
            if self.file is None and self.size > MAP_MIN_BYTES:
                import tempfile

                self.file = tempfile.TemporaryFile(dir=spill_dir())
                for held in self.pieces:
                    self.file.write(held)
                self.pieces = []
            if self.file is None:
                self.pieces.append(piece)
            else:
                self.file.write(piece)
        except OSError as e:
            self.close()
            raise TraceError(self.path, f"cannot inflate to a temporary file in {spill_dir()}: "
                                        f"{e.strerror or e} (set DIAG_TMPDIR to a folder with room)") from None

    def result(self):
        if self.file is None:          # one piece (up to PIECE inflated) is returned as it is, not copied
            return self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)
        try:
            self.file.flush()
            return _register(mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ))
        finally:
            self.close()              # the map keeps the (unlinked) file's pages

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def read_bytes(path: str) -> bytes:
    """The file's JSON bytes, decompressed when it is gzip (by content, not by name); a big
    plain file as a read-only map of it. Taken from prefetch when it was read ahead."""
    ahead, data = prefetch.take(path)
    return data if ahead else read_file(path)


def read_file(path: str) -> bytes:
    """read_bytes, always from the file. Only a regular file is read (safeio.open_regular: a FIFO
    or a device named like a trace is refused, not waited on), and never more bytes than it had
    when opened plus MAP_MIN_BYTES, whatever size it claims (a /proc file claims 0)."""
    with open_regular(path) as f:
        mapped = _map(f)
        if mapped is not None:
            return mapped
        f.seek(0)
        data = read_bounded(f, path, os.fstat(f.fileno()).st_size + MAP_MIN_BYTES)
    if data[:2] == GZIP_MAGIC:
        return gunzip(path, data)
    return data


# JSON traces compress 5-20x; a file that inflates far more is a decompression bomb.
MAX_RATIO = 100
PIECE = 16 << 20           # inflated bytes per zlib call
IN_PIECE = 1 << 20         # compressed bytes fed per zlib call
MIN_LIMIT = 64 << 20


def inflate_limit(compressed: int) -> int:
    """DIAG_MAX_TRACE_BYTES when set (lower or higher), else MAX_RATIO x the file, at least MIN_LIMIT."""
    env = os.environ.get("DIAG_MAX_TRACE_BYTES", "")
    return int(env) if env.isdigit() else max(MIN_LIMIT, MAX_RATIO * compressed)


def gunzip(path: str, data: bytes):
    """Decompress every gzip member (ISA-L's inflate where installed, else zlib's), refusing to
    inflate past inflate_limit(). Bytes, or past MAP_MIN_BYTES a map of the inflated bytes in an unlinked temporary file (_Inflated).
    The input is fed IN_PIECE at a time: zlib copies what it has not consumed (unconsumed_tail)
    on every call, which over the whole file would be quadratic in time and double its memory."""
    limit = inflate_limit(len(data))
    out = _Inflated(path)
    mv = memoryview(data)
    pos = 0

    def room() -> int:
        return min(PIECE, limit - out.size + 1)

    def take(piece: bytes) -> None:
        out.write(piece)
        if out.size > limit:
            raise TraceError(path, f"inflates to more than {limit:,} bytes, {limit // len(data):,}x its size "
                                   "(a decompression bomb?); set DIAG_MAX_TRACE_BYTES to allow more")

    try:
        while bytes(mv[pos:pos + 2]) == GZIP_MAGIC:
            d = _inflate.decompressobj(31)
            while not d.eof:
                buf = mv[pos:pos + IN_PIECE]
                pos += len(buf)
                if not buf:                   # all fed: only what zlib still holds can come out
                    more = d.decompress(b"", room())
                    if not more:
                        raise TraceError(path, "truncated gzip (file ends before the end of the stream)")
                    take(more)
                while buf and not d.eof:
                    take(d.decompress(buf, room()))
                    buf = d.unconsumed_tail
            pos -= len(d.unused_data)         # the next member starts in the last piece fed
    except (zlib.error, _inflate.error) as e:
        out.close()
        raise TraceError(path, f"corrupt gzip: {e}") from None
    except TraceError:
        out.close()
        raise
    return out.result()


# From this size the top level is decoded around the events (schema.decode_split) instead of
# over them: skipping 50 MB of events costs ~0.07 s, and the chunks decode (and check) them anyway.
SPLIT_MIN_BYTES = 1 << 20


def splits(data) -> bool:
    return len(memoryview(data)) >= SPLIT_MIN_BYTES


def decode_trace(path: str, data: bytes, split: "bool | None" = None) -> schema.TraceFile:
    """The top level, the events left raw. split (default: from SPLIT_MIN_BYTES) first tries
    schema.decode_split, which does not read the events' bytes."""
    import msgspec

    from . import schema

    if schema.first_byte(data) is None:
        raise TraceError(path, "empty file")
    try:
        doc = schema.decode(data, split=splits(data) if split is None else split)
    except msgspec.ValidationError as e:
        if schema.first_byte(data) not in (b"{", b"["):
            raise TraceError(path, "not JSON") from None
        raise TraceError(path, f"not a PyTorch profiler trace: {e}") from None
    except RecursionError:
        raise TraceError(path, "not a PyTorch profiler trace: JSON nested too deeply") from None
    except UnicodeDecodeError as e:
        raise TraceError(path, f"not JSON: invalid UTF-8 at byte {e.start}") from None
    except msgspec.DecodeError as e:
        msg = str(e)
        if "truncated" in msg.lower():
            raise TraceError(path, "truncated JSON (file ends mid-document)") from None
        raise TraceError(path, f"not JSON: {msg}") from None
    if not len(memoryview(doc.traceEvents)):
        raise TraceError(path, "not a PyTorch profiler trace: no 'traceEvents'")
    if schema.is_empty_array(doc.traceEvents):
        raise TraceError(path, "no events in 'traceEvents'")
    release(data)                         # the top level is decoded; the events come chunk by chunk
    return doc


PARALLEL_MIN_BYTES = 256 << 20     # on disk
PARALLEL_MIN_FILES = 32


def workers() -> int:
    """Worker processes for one big file: the usable cores, or DIAG_WORKERS."""
    env = os.environ.get("DIAG_WORKERS")
    if env and env.isdigit():
        return max(1, int(env))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def in_one_process(sizes: list[int]) -> bool:
    """Whether a job's files (sizes: bytes on disk) are loaded one after the other in this process
    rather than spread over worker processes (job.each_file). A pool costs ~0.1 s: it pays off
    from a few dozen rank files (measured: 13-16% faster at 64 and 256 small gzipped ranks on 2
    cores) or a few big ones; DIAG_WORKERS forces either way."""
    n = min(workers(), len(sizes))
    big = len(sizes) >= PARALLEL_MIN_FILES or (len(sizes) >= 4 and sum(sizes) >= PARALLEL_MIN_BYTES)
    return n < 2 or not (big or os.environ.get("DIAG_WORKERS")) or not hasattr(os, "fork")


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
