"""Reading a trace file's bytes: plain or gzip JSON, with errors a user can act on."""
from __future__ import annotations

import os
import zlib

import msgspec

from . import schema
from .errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: str) -> bytes:
    """The file's JSON bytes, decompressed when it is gzip (by content, not by name)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, expected a trace file") from None
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if data[:2] == GZIP_MAGIC:
        return gunzip(path, data)
    return data


# JSON traces compress 5-20x; a file that inflates far more is a decompression bomb.
MAX_RATIO = 100
PIECE = 16 << 20
MIN_LIMIT = 64 << 20


def inflate_limit(compressed: int) -> int:
    """DIAG_MAX_TRACE_BYTES when set (lower or higher), else MAX_RATIO x the file, at least MIN_LIMIT."""
    env = os.environ.get("DIAG_MAX_TRACE_BYTES", "")
    return int(env) if env.isdigit() else max(MIN_LIMIT, MAX_RATIO * compressed)


def gunzip(path: str, data: bytes) -> bytearray:
    """Decompress every gzip member, refusing to inflate past inflate_limit()."""
    limit = inflate_limit(len(data))
    out = bytearray()
    rest = data
    try:
        while rest[:2] == GZIP_MAGIC:
            d = zlib.decompressobj(31)
            buf = rest
            while buf:
                out += d.decompress(buf, min(PIECE, limit - len(out) + 1))
                if len(out) > limit:
                    raise TraceError(path, f"inflates to more than {limit:,} bytes, {limit // len(data):,}x its size "
                                           "(a decompression bomb?); set DIAG_MAX_TRACE_BYTES to allow more")
                buf = d.unconsumed_tail
            if not d.eof:
                raise TraceError(path, "truncated gzip (file ends before the end of the stream)")
            rest = d.unused_data
    except zlib.error as e:
        raise TraceError(path, f"corrupt gzip: {e}") from None
    return out


def decode_trace(path: str, data: bytes) -> schema.TraceFile:
    if schema.first_byte(data) is None:
        raise TraceError(path, "empty file")
    try:
        doc = schema.decode(data)
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
    return doc


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
