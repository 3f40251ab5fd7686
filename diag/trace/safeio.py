"""Opening and writing files without trusting their names: the one place every reader and writer goes.

Reading: a FIFO named like a trace blocks `open` until a writer comes; a symlink to /dev/zero
reports a size of 0 and never ends. So files are opened non-blocking, only regular files are
read, and every read is bounded by the bytes actually read, never by the size the file claims.

Writing: a temporary with a predictable name (`<out>.<pid>.partial`) can be planted as a symlink
that makes the writer overwrite any file the user can write. Temporaries are created exclusively
(mkstemp / mkdtemp, O_EXCL, in the target's directory) and renamed over the target, so a reader
never sees half a file and no planted name is followed. A target that is not a regular file
(`-o /dev/null`, `/dev/stdout`, a FIFO) is written in place, as a shell's `>` would: renamed
over, /dev/null would become a regular file (as root) or refuse the write. A report is never written over the files
it was made from (`refuse_overwrite`), unless the user says so.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from typing import BinaryIO, Iterable, Iterator, Optional, Union

from .errors import TraceError

SMALL_FILE_BYTES = 64 << 20           # run metadata, bench curves, config files: far below this
_PIECE = 1 << 20                       # bytes per read past what a file claims
_FIRST_MAX = 64 << 20                  # the first read: what the file claims, up to this


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str):
    """A binary file object for `path`, which must be a regular file (symlinks followed).
    Opened non-blocking, so a FIFO does not hang here; raises TraceError naming the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise TraceError(path, "cannot read: no such file") from None
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise TraceError(path, f"is {_kind(mode)}, not a regular file: not read")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(f, path: str, limit: int) -> bytes:
    """At most `limit` bytes from the open file f; TraceError if it holds more (whatever its size
    says). Read as much as the file claims first, then in pieces: memory follows the bytes that
    come, never `limit` (read(n) allocates n bytes up front)."""
    try:
        first = max(0, min(limit + 1, _FIRST_MAX, os.fstat(f.fileno()).st_size - f.tell() + 1))
        chunks = [f.read(first)] if first else []
        total = len(chunks[0]) if chunks else 0
        while total <= limit:
            piece = f.read(min(_PIECE, limit + 1 - total))
            if not piece:
                break
            chunks.append(piece)
            total += len(piece)
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if total > limit:
        raise TraceError(path, f"larger than {limit:,} bytes: not read (not the file expected here?)")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_regular(path: str, limit: int = SMALL_FILE_BYTES) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them (else TraceError)."""
    with open_regular(path) as f:
        return read_bounded(f, path, limit)


def is_regular(path: str) -> bool:
    """A regular file (symlinks followed): what a directory listing may hand to a reader."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


# --- writing ----------------------------------------------------------------------------------
def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def special(path: str) -> bool:
    """Whether path names something that is there and is neither a regular file nor a folder (a
    device such as /dev/null, a FIFO, /dev/stdout's pipe or terminal), following symlinks."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def atomic_write(path: str, data: Union[bytes, str]) -> None:
    """Write `data` to `path` (atomic_open): never half a file under `path`, never a planted name
    followed; a device or a FIFO (`-o /dev/null`) is written in place."""
    with atomic_open(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def atomic_open(path: str, buffering: int = -1) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s content into: an exclusively created temporary in the same
    directory, renamed over `path` when the block ends without error and removed when it does not.
    A device or a FIFO (`-o /dev/null`, /dev/stdout) is written in place, as a shell's `>` would."""
    if special(path):
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)        # no O_CREAT: it is there, and stays what it is
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            yield f
        return
    import tempfile                   # here: ~4 ms to import, for the runs that write a file

    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            os.fchmod(f.fileno(), _umask_mode())       # mkstemp's 0600 is for the temporary only
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def exclusive_temp_path(path: str) -> Iterator[str]:
    """A fresh path to write `path`'s content under (for writers that open by name, such as
    torch's export_chrome_trace), inside a private directory made with mkdtemp next to `path`;
    renamed over `path` when the block ends without error. The directory is removed either way."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(path)),
                              prefix=f".{os.path.basename(path)}.", suffix=".partial")
    tmp = os.path.join(folder, os.path.basename(path))
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def refuse_overwrite(output: str, inputs: Iterable[str]) -> Optional[str]:
    """Why writing `output` would destroy an input (the file itself, or anything inside an
    analysed directory), or None when it would not."""
    out = os.path.realpath(output)
    for given in inputs:
        src = os.path.realpath(given)
        if out == src or (os.path.exists(out) and os.path.exists(src) and os.path.samefile(out, src)):
            return f"{output} is an input of this command; not overwritten (--force to write it anyway)"
        if os.path.isdir(src) and os.path.commonpath([out, src]) == src:
            what = "would overwrite a file of" if os.path.exists(out) else "is inside"
            return f"{output} {what} the analysed directory {given}; not written (--force to write it anyway)"
    return None
