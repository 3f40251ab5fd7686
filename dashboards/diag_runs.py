"""Which runs the dashboard may open, and loading them once.

Problem: the dashboard is a web server; a run is named by a query parameter, a picker or
an upload, and none of those may reach a file outside the folder it was started on.
Every path is resolved (symlinks included) and must stay under the root; a run folder
whose trace files point outside the root is refused as a whole. Uploads are written,
under their bare file names, to a private temporary folder and capped in size; the folder
is removed when its session lets go of it (a new upload, the upload removed), when the
session has ended (checked at every page run of any session) and, whatever is left, when
the server exits.
Loaded runs are kept in a small process-wide cache keyed by path and file signatures,
so a big trace is parsed once, not on every click.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from diag.analysis.collect import items_of
from diag.runinputs import BENCH_NEXT_TO_TRACES, RunInputs, open_run
from diag.trace.errors import TraceError
from diag.analysis.gantt import PipelineGantt
from diag.analysis.results import Diagnosis
from diag.trace.job import NOT_TRACES, RUN_METADATA, SUMMARY_SUFFIX, TRACE_SUFFIXES

DEFAULT_MAX_UPLOAD_MB = 500
CACHE_RUNS = 8
MAX_DEPTH = 4


@dataclass
class Settings:
    """The dashboard's configuration, from the environment `diag dashboard` sets."""

    root: Path
    run: Optional[str] = None          # run to open first, relative to root
    max_upload_mb: int = DEFAULT_MAX_UPLOAD_MB

    @classmethod
    def from_env(cls) -> "Settings":
        root = Path(os.environ.get("DIAG_DASHBOARD_ROOT") or os.getcwd()).resolve()
        mb = int(os.environ.get("DIAG_DASHBOARD_MAX_UPLOAD_MB") or DEFAULT_MAX_UPLOAD_MB)
        return cls(root=root, run=os.environ.get("DIAG_DASHBOARD_RUN") or None, max_upload_mb=mb)


@dataclass
class LoadedRun:
    label: str
    path: str
    diagnosis: Diagnosis
    gantt: PipelineGantt
    advice: Any = None                 # diag.advise Advice, when the recommender is installed
    calibration: Any = None            # diag.advise Calibration, or the reason there is none (str)


def advise_run(d: Diagnosis) -> tuple[Any, Any]:
    """(Advice, Calibration or why not) from diag.advise; (None, reason) where it is missing."""
    try:
        from diag.advise.calibrate import CalibrationError, calibrate
        from diag.advise.results import Advice
    except ImportError as e:
        return None, f"the recommender is not installed ({e})"
    try:
        cal = calibrate(d)              # the model itself, for the what-if; the advice came with d
    except CalibrationError as e:
        cal = str(e)
    return Advice.of(d), cal


def inside(root: Path, path: Path) -> bool:
    """True when path, with every symlink resolved, is root or below it."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(root.resolve())
    except (OSError, ValueError):
        return False


def safe_path(root: Path, name: str) -> Optional[Path]:
    """The run named `name` (relative to root, or absolute) if it, and every file its analysis
    would read, is under root; else None. The one gate of every file the app opens."""
    if not name or "\x00" in name:
        return None
    p = Path(name) if os.path.isabs(name) else root / name
    if not p.exists() or not inside(root, p):
        return None
    try:
        files = run_files(p)
    except (TraceError, OSError):
        return None
    if not all(inside(root, Path(f)) for f in files):
        return None                    # a trace, a summary or diag_run.json beside it links outside
    return Path(os.path.realpath(p))


def run_files(p: Path) -> list[str]:
    """Every file the analysis of run p (a folder or one trace) reads: the traces and summaries
    analysis.collect picks (in subfolders too), diag_run.json and diag_bench.json beside them."""
    items, meta_dir, _ = items_of(str(p))
    files = [f for it in items for f in (it.trace, it.summary) if f]
    near = {meta_dir, str(p) if p.is_dir() else os.path.dirname(os.path.abspath(p))}
    files += [os.path.join(d, n) for d in sorted(near) for n in (RUN_METADATA, BENCH_NEXT_TO_TRACES)
              if os.path.lexists(os.path.join(d, n))]
    if not p.is_dir() and os.path.lexists(str(p) + SUMMARY_SUFFIX):
        files.append(str(p) + SUMMARY_SUFFIX)
    return files


def _is_trace(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES) and name not in NOT_TRACES


def list_runs(root: Path, limit: int = 200) -> list[str]:
    """Folders under root holding trace files (and trace files alone in a folder that is not
    a run), relative to root, in order; symlinks leaving the root are not followed."""
    root = root.resolve()
    runs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        depth = len(here.relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and inside(root, here / d))
        if depth >= MAX_DEPTH:
            dirnames[:] = []
        if any(_is_trace(f) for f in filenames) and safe_path(root, str(here)):
            runs.append(str(here.relative_to(root)) if here != root else ".")
        if len(runs) >= limit:
            break
    return runs


def clean_name(name: str) -> Optional[str]:
    """An uploaded file's bare name, or None when nothing safe is left of it."""
    base = os.path.basename(name.replace("\\", "/")).strip()
    if not base or base.startswith(".") or "\x00" in base or not (_is_trace(base) or base == RUN_METADATA):
        return None
    return base


_UPLOADS: dict[str, Optional[str]] = {}    # upload folders this server process made -> owning session


def drop_upload(folder: Optional[str]) -> None:
    """Remove an upload folder this process made (and nothing else)."""
    if folder in _UPLOADS:
        del _UPLOADS[folder]
        shutil.rmtree(folder, ignore_errors=True)


def drop_orphan_uploads(alive: Callable[[str], bool]) -> None:
    """Remove the upload folders of sessions that `alive` says have ended."""
    for folder, owner in list(_UPLOADS.items()):
        if owner is not None and not alive(owner):
            drop_upload(folder)


@atexit.register
def _drop_all_uploads() -> None:
    for folder in list(_UPLOADS):
        drop_upload(folder)


def new_upload_folder(owner: Optional[str] = None) -> Path:
    folder = tempfile.mkdtemp(prefix="diag-upload-")
    _UPLOADS[folder] = owner
    return Path(folder)


def save_uploads(files, max_mb: int, dest: Optional[Path] = None,
                 owner: Optional[str] = None) -> tuple[Optional[Path], list[str]]:
    """Write uploaded files (objects with .name, .size, .getvalue()) under a new private folder
    owned by session `owner`. Returns (folder or None, problems). Refuses everything when the
    total exceeds max_mb."""
    total = sum(int(f.size) for f in files)
    if total > max_mb * 1024 * 1024:
        return None, [f"upload of {total / 2**20:,.1f} MB refused: the limit is {max_mb} MB"]
    dest = dest or new_upload_folder(owner)
    problems, saved = [], 0
    for f in files:
        name = clean_name(f.name)
        if name is None:
            problems.append(f"{f.name!r} refused: not a trace (.json, .json.gz) or diag_run.json")
            continue
        target = dest / name
        if not inside(dest, target):
            problems.append(f"{f.name!r} refused: outside the upload folder")
            continue
        target.write_bytes(f.getvalue())
        saved += 1
    if not saved:
        drop_upload(str(dest))
    return (dest if saved else None), problems


def _stat(f: str) -> tuple:
    try:
        st = os.stat(f)
    except OSError:                   # a dangling link or a file gone: the analysis names it
        return f, None, None
    return f, st.st_size, st.st_mtime_ns


def _signature(path: Path) -> tuple:
    return tuple(_stat(f) for f in run_files(path))


def load_run(path: Path, label: str, cache: OrderedDict,
             progress: Optional[Callable[[str, int, int], None]] = None,
             inputs: Optional[RunInputs] = None) -> LoadedRun:
    """Diagnosis and pipeline Gantt of a run opened with `inputs` (default: `diag dashboard`'s
    flags), from the cache when neither its files nor the inputs have changed."""
    inputs = inputs or RunInputs.from_json(os.environ.get("DIAG_DASHBOARD_INPUTS"))
    key = (str(path), _signature(path), inputs.to_json())
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    d = open_run(str(path), inputs, progress=progress)
    advice, cal = advise_run(d)
    run = LoadedRun(label=label, path=str(path), diagnosis=d, advice=advice, calibration=cal,
                    gantt=d.gantt)
    cache[key] = run
    while len(cache) > CACHE_RUNS:
        cache.popitem(last=False)
    return run
