#!/usr/bin/env python3
"""Run Holistic Trace Analysis (HTA) on one trace the way a user would, and print its numbers.

`diag analyze` must agree with HTA's temporal breakdown and comm/comp overlap. This script is the
reference side of that comparison and of the speed/memory benchmark: it loads a trace file or a
directory of per-rank traces with `hta.trace_analysis.TraceAnalysis(trace_dir=...)`, runs
`get_temporal_breakdown(visualize=False)` and `get_comm_comp_overlap(visualize=False)`, and prints
(or writes) JSON:

    {"hta_version": ..., "path": ..., "ranks": {rank: {idle_us, compute_us, non_compute_us,
     kernel_us, idle_pct, compute_pct, non_compute_pct, comm_comp_overlap_pct}},
     "timings": {"load_s", "breakdown_s", "overlap_s", "analysis_s"}, ...}

or {"error": "..."} when HTA fails (it does on some real traces), never a traceback.

HTA wants a directory; a single file is linked into a temporary directory. It must run in its own
process: the benchmark measures the peak RSS of that whole process.

`--raw` adds what a reimplementation needs to compare beyond HTA's 2-decimal rounding: the
unrounded fractions, the unrounded overlap ratio (a second overlap call with `round` disabled),
and how many GPU-timeline rows HTA selected per rank. It costs time and memory, so the benchmark
does not pass it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, Optional


def _num(x: Any) -> Optional[float]:
    """JSON-safe number: numpy scalars to float, NaN/inf to None."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def _trace_dir_for(path: str) -> tuple[str, Optional[str]]:
    """HTA only takes directories: link a single file into a fresh temp dir."""
    if os.path.isdir(path):
        return path, None
    tmp = tempfile.mkdtemp(prefix="hta_run_")
    os.symlink(os.path.abspath(path), os.path.join(tmp, os.path.basename(path)))
    return tmp, tmp


def _raw_overlap_ratio(analyzer) -> Dict[int, Optional[float]]:
    """Re-run HTA's overlap with the module's `round` made the identity, to get the raw ratio."""
    import hta.analyzers.communication_analysis as ca

    ca.round = lambda x, ndigits=None: x  # module global shadows the builtin
    try:
        df = analyzer.get_comm_comp_overlap(visualize=False)
    finally:
        del ca.round
    return {int(r): _num(v) / 100.0 if _num(v) is not None else None
            for r, v in zip(df["rank"], df["comp_comm_overlap_pctg"])}


def _selection_stats(analyzer) -> Dict[int, Dict[str, Any]]:
    """How many rows HTA put on each rank's GPU timeline (stream != -1), by kernel type."""
    from hta.utils.utils import get_kernel_type

    sym = analyzer.t.symbol_table.get_sym_table()
    out: Dict[int, Dict[str, Any]] = {}
    for rank, df in analyzer.t.traces.items():
        gpu = df[df["stream"].ne(-1)]
        types = gpu["name"].map(lambda i: get_kernel_type(sym[i])).value_counts()
        cats = gpu["cat"].map(lambda i: sym[i]).value_counts()
        out[int(rank)] = {
            "gpu_rows": int(len(gpu)),
            "rows_total": int(len(df)),
            "by_kernel_type": {k: int(v) for k, v in types.items()},
            "by_cat": {k: int(v) for k, v in cats.items()},
        }
    return out


def run_hta(path: str, raw: bool = False) -> Dict[str, Any]:
    import hta
    from hta.trace_analysis import TraceAnalysis

    result: Dict[str, Any] = {
        "hta_version": getattr(hta, "__version__", None) or _hta_version(),
        "path": path,
    }
    trace_dir, tmp = _trace_dir_for(path)
    try:
        t0 = time.perf_counter()
        try:
            analyzer = TraceAnalysis(trace_dir=trace_dir)
        except BaseException as exc:  # HTA raises assorted errors on real traces
            result["error"] = "load: " + _err(exc)
            result["traceback"] = traceback.format_exc(limit=-3)
            return result
        t1 = time.perf_counter()
        files = {int(r): os.path.basename(f) for r, f in analyzer.t.trace_files.items()}
        result["trace_files"] = files
        if os.path.isdir(path):
            on_disk = sorted(f for f in os.listdir(path) if f.endswith((".json", ".gz")))
            ignored = sorted(set(on_disk) - set(files.values()))
            if ignored:  # HTA keeps the last file per rank and says so only in a log line
                result["ignored_files"] = ignored
        ranks: Dict[int, Dict[str, Any]] = {}
        try:
            tb = analyzer.get_temporal_breakdown(visualize=False)
        except BaseException as exc:
            result["error"] = "get_temporal_breakdown: " + _err(exc)
            result["traceback"] = traceback.format_exc(limit=-3)
            return result
        t2 = time.perf_counter()
        for row in tb.to_dict("records"):
            ranks[int(row["rank"])] = {
                "idle_us": _num(row["idle_time(us)"]),
                "compute_us": _num(row["compute_time(us)"]),
                "non_compute_us": _num(row["non_compute_time(us)"]),
                "kernel_us": _num(row["kernel_time(us)"]),
                "idle_pct": _num(row["idle_time_pctg"]),
                "compute_pct": _num(row["compute_time_pctg"]),
                "non_compute_pct": _num(row["non_compute_time_pctg"]),
            }
        try:
            ov = analyzer.get_comm_comp_overlap(visualize=False)
            for r, v in zip(ov["rank"], ov["comp_comm_overlap_pctg"]):
                ranks.setdefault(int(r), {})["comm_comp_overlap_pct"] = _num(v)
        except BaseException as exc:
            result["overlap_error"] = "get_comm_comp_overlap: " + _err(exc)
        t3 = time.perf_counter()
        result["timings"] = {
            "load_s": t1 - t0,
            "breakdown_s": t2 - t1,
            "overlap_s": t3 - t2,
            "analysis_s": t3 - t1,
            "total_s": t3 - t0,
        }
        if raw:
            raw_ov = _raw_overlap_ratio(analyzer)
            stats = _selection_stats(analyzer)
            for r, d in ranks.items():
                k = d.get("kernel_us")
                if k:
                    d["idle_frac"] = d["idle_us"] / k
                    d["compute_frac"] = d["compute_us"] / k
                    d["non_compute_frac"] = d["non_compute_us"] / k
                d["comm_comp_overlap_ratio"] = raw_ov.get(r)
                d["selection"] = stats.get(r)
        result["ranks"] = {str(r): ranks[r] for r in sorted(ranks)}
        return result
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _hta_version() -> Optional[str]:
    try:
        from importlib.metadata import version

        return version("HolisticTraceAnalysis")
    except Exception:
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="trace file (.json/.json.gz) or directory of per-rank traces")
    ap.add_argument("--json", metavar="OUT", help="write the JSON here instead of stdout")
    ap.add_argument("--raw", action="store_true",
                    help="add unrounded fractions/overlap ratio and row-selection stats")
    ap.add_argument("--quiet", action="store_true", help="silence HTA's logging")
    args = ap.parse_args(argv)
    if args.quiet:
        import logging

        logging.disable(logging.CRITICAL)
    res = run_hta(args.path, raw=args.raw)
    text = json.dumps(res, indent=1, sort_keys=False)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
