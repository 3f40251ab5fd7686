"""Big traces as memory maps, and giving their pages back once decoded.

A plain JSON trace past MAP_MIN_BYTES (and a gzip one that inflates past it) is mapped, not read:
its pages are the page cache's, and each chunk's pages are dropped from the process once decoded
(release), so a 2 GB trace never sits in the process's memory whole. The maps are registered
here so that `release` can find the map a decoded slice lies in; the reader (read.py) and the
decoder (schema.py, chunks.py) both use this module, and neither imports the other for it.
"""
from __future__ import annotations

import mmap
import weakref

MAP_MIN_BYTES = 64 << 20
_PAGE = mmap.PAGESIZE
_MAPS: "weakref.WeakValueDictionary[int, mmap.mmap]" = weakref.WeakValueDictionary()


def _address(buf) -> int:
    import numpy as np

    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if len(memoryview(buf)) else 0


def register(mm: mmap.mmap) -> mmap.mmap:
    """Remember a trace's map (read sequentially) so release() can find it."""
    if hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_SEQUENTIAL)
    _MAPS[_address(mm)] = mm
    return mm


def is_mapped(data) -> bool:
    return isinstance(data, mmap.mmap)


def release(buf, start: int = 0, stop: "int | None" = None) -> None:
    """Drop the pages of buf[start:stop] from this process's memory when buf lies in a mapped
    trace file (a no-op otherwise). Read again, they come back from the page cache."""
    if not _MAPS or not hasattr(mmap, "MADV_DONTNEED"):
        return
    addr = _address(buf)
    for base, mm in list(_MAPS.items()):
        if base <= addr < base + len(mm):
            lo = (addr - base + start) // _PAGE * _PAGE
            hi = min(len(mm), addr - base + (len(memoryview(buf)) if stop is None else stop))
            if hi > lo:
                mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            return
