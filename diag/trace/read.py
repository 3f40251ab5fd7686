"""Reading a trace file's bytes: plain or gzip JSON, with errors a user can act on."""
from __future__ import annotations

import gzip
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
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise TraceError(path, "truncated gzip (file ends before the end of the stream)") from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise TraceError(path, f"corrupt gzip: {e}") from None
    return data


def decode_trace(path: str, data: bytes) -> schema.TraceFile:
    if schema.first_byte(data) is None:
        raise TraceError(path, "empty file")
    try:
        doc = schema.decode(data)
    except msgspec.ValidationError as e:
        if schema.first_byte(data) not in (b"{", b"["):
            raise TraceError(path, "not JSON") from None
        raise TraceError(path, f"not a PyTorch profiler trace: {e}") from None
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
