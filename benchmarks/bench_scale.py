#!/usr/bin/env python3
"""How `diag analyze` and HTA scale with events per rank and with the number of ranks.

Inputs are synthesised jobs (diag.advise.simulate + diag.advise.synth.write_job: one gzipped
Kineto trace per rank plus diag_run.json), written under bench_out/scale/ and reused on later
runs when their spec has not changed (--regen rebuilds them). Two series:

  events  a fixed rank count (tp=2 pp=2 dp=2, 8 ranks), the per-rank trace grown by the number
          of layers, micro-batches and steps: three sizes, roughly 10x apart
  ranks   a fixed small per-rank trace at 8, 64, 256 and 1,024 ranks (tp=2 pp=2 dp=2/16/64/256)

Each point is measured as whole processes with bench_analyze.measure() (wall time from fork to
reaping; peak memory = max(ru_maxrss from os.wait4, peak PSS summed over the process tree)):

  diag        `diag analyze DIR --no-summaries --format json --output /dev/null`: the full
              analysis of every trace, DIAG_WORKERS unset (default: the per-file process pool
              for >= 32 files, or >= 4 files and >= 256 MB on disk)
  diag[no meta]  the same on DIR.hta/ (HTA's input: the rank files alone, symlinked; without
              diag_run.json diag makes no recommendations)
  diag[w=1]   the full analysis with DIAG_WORKERS=1 (one process), on points with >= 64 ranks
              (--workers-min-ranks): the memory of the pool against one process
  summarize   `diag summarize DIR --force -q`: every rank's per-rank pass in one task on this
              machine (on a cluster this work is spread over the job's nodes)
  merge       `diag analyze DIR ...` again, now reading the summaries: the cost left to the
              machine that analyses the job
  hta         `benchmarks/hta_run.py DIR.hta --quiet` with a per-point timeout (--hta-timeout); a
              point whose smaller sibling in the same series already timed out is not run and
              is recorded as "timeout" too (it can only be slower)

Output: a markdown table on stdout and, with --out, everything as JSON.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from bench_analyze import find_diag, measure  # noqa: E402  (reuse, do not copy)

MS = 1e-3


@dataclass(frozen=True)
class Point:
    series: str          # "events" or "ranks"
    tp: int
    pp: int
    dp: int
    layers: int
    micro: int
    steps: int

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def name(self) -> str:
        return f"tp{self.tp}pp{self.pp}dp{self.dp}_L{self.layers}_m{self.micro}_s{self.steps}"


# events per rank grow ~ layers/pp * micro * steps; ranks series keeps the smallest trace.
EVENT_SIZES = [(8, 4, 3), (32, 8, 4), (64, 16, 8)]       # (layers, micro-batches, steps)
RANK_DPS = [2, 16, 64, 256]                              # x tp=2 pp=2 -> 8, 64, 256, 1024 ranks
QUICK_EVENT_SIZES = [(8, 4, 3), (16, 4, 3), (32, 4, 3)]
QUICK_RANK_DPS = [2, 4, 8]


def points(quick: bool) -> List[Point]:
    sizes, dps = (QUICK_EVENT_SIZES, QUICK_RANK_DPS) if quick else (EVENT_SIZES, RANK_DPS)
    pts = [Point("events", 2, 2, 2, L, m, s) for L, m, s in sizes]
    L, m, s = sizes[0]
    pts += [Point("ranks", 2, 2, dp, L, m, s) for dp in dps]
    return pts


# ---------------------------------------------------------------- inputs

def synthesise(p: Point, out_dir: str, regen: bool) -> Dict[str, Any]:
    """Write P's job into OUT_DIR (reused if its spec file matches); return its sizes.

    The writing happens in a child process. On Linux a child started by fork/vfork + exec
    keeps the parent's RSS high-water mark in its ru_maxrss, so a parent that once held a big
    simulated timeline would inflate every later measurement; this process must stay small.
    """
    spec_path = os.path.join(out_dir, "bench_scale.spec")
    spec = asdict(p)
    if not regen and os.path.exists(spec_path):
        with open(spec_path) as fh:
            old = json.load(fh)
        if old.get("point") == spec:
            return old["sizes"]
    import subprocess
    subprocess.run([sys.executable, os.path.abspath(__file__), "--synth-child",
                    json.dumps(spec), out_dir], check=True, cwd=ROOT)
    with open(spec_path) as fh:
        return json.load(fh)["sizes"]


def _synth_child(p: Point, out_dir: str) -> None:
    spec_path = os.path.join(out_dir, "bench_scale.spec")
    spec = asdict(p)
    from diag.advise import Config, Links, Workload, simulate
    from diag.advise.synth import write_job

    if os.path.isdir(out_dir):
        for f in os.listdir(out_dir):
            os.remove(os.path.join(out_dir, f))
    if os.path.isdir(out_dir.rstrip("/") + ".hta"):
        for f in os.listdir(out_dir.rstrip("/") + ".hta"):
            os.remove(os.path.join(out_dir.rstrip("/") + ".hta", f))
    t0 = time.perf_counter()
    w = Workload(num_layers=p.layers, fwd_s_per_layer=2 * MS, tp_bytes_per_layer=8e6,
                 p2p_bytes=4e6, grad_bytes=4e8, optimizer_s=1 * MS)
    c = Config(tp=p.tp, pp=p.pp, dp=p.dp, num_micro_batches=p.micro, overlap_grad_reduce=True,
               bucket_bytes=1e8)
    tl = simulate(w, c, Links(tp=200e9, pp=50e9, dp=25e9), steps=p.steps)
    paths = write_job(tl, out_dir, c, w, gz=True)
    ranks = [q for q in paths if q.endswith(".gz")]
    with gzip.open(ranks[0], "rb") as fh:
        doc = json.loads(fh.read())
    raw0 = len(json.dumps(doc).encode())
    sizes = {"files": len(ranks), "events_per_rank": len(doc["traceEvents"]),
             "events_total": None, "bytes_on_disk": sum(os.path.getsize(q) for q in ranks),
             "bytes_uncompressed_est": raw0 * len(ranks),
             "synth_s": time.perf_counter() - t0}
    # every rank of a stage has the same program; count them all anyway (cheap at these sizes)
    total = 0
    for q in ranks:
        with gzip.open(q, "rb") as fh:
            total += len(json.loads(fh.read())["traceEvents"])
    sizes["events_total"] = total
    with open(spec_path, "w") as fh:
        json.dump({"point": spec, "sizes": sizes}, fh, indent=1)


def hta_dir(out_dir: str) -> str:
    """The rank files alone, symlinked into OUT_DIR.hta/: HTA reads every *.json in its
    directory as a trace, and diag_run.json / bench_scale_spec.json (no traceEvents) make it
    fail with "'DataFrame' object has no attribute 'cat'"."""
    d = out_dir.rstrip("/") + ".hta"
    os.makedirs(d, exist_ok=True)
    want = {f for f in os.listdir(out_dir) if f.endswith(".pt.trace.json.gz")}
    for f in os.listdir(d):
        if f not in want:
            os.remove(os.path.join(d, f))
    for f in want:
        if not os.path.lexists(os.path.join(d, f)):
            os.symlink(os.path.join(os.path.abspath(out_dir), f), os.path.join(d, f))
    return d


# ---------------------------------------------------------------- measuring

def _status(r: Dict[str, Any]) -> str:
    if r.get("skipped"):
        return "timeout"
    if r["timed_out"]:
        return "timeout"
    if r["rc"] != 0:
        return f"rc={r['rc']}"
    try:  # hta_run.py prints {"error": ...} instead of a traceback
        doc = json.loads(r.get("stdout") or "null")
        if isinstance(doc, dict) and doc.get("error"):
            return "error"
    except ValueError:
        pass
    return "ok"


def bench_point(p: Point, d: str, args, diag_cmd, hta_skip: bool) -> Dict[str, Any]:
    tools: Dict[str, List[str]] = {}
    if diag_cmd:
        base = diag_cmd + ["analyze", d, "--no-summaries", "--format", "json", "--output", os.devnull]
        tools["diag"] = base
        # the rank files alone (HTA's exact input): no diag_run.json, so no recommendations
        tools["diag[no meta]"] = diag_cmd + ["analyze", hta_dir(d), "--no-summaries", "--format", "json",
                                             "--output", os.devnull]
        if p.ranks >= args.workers_min_ranks:
            tools["diag[w=1]"] = ["env", "DIAG_WORKERS=1"] + base
        tools["summarize"] = diag_cmd + ["summarize", d, "--force", "--quiet"]
        tools["merge"] = diag_cmd + ["analyze", d, "--format", "json", "--output", os.devnull]
    if not args.skip_hta:
        tools["hta"] = [sys.executable, os.path.join(HERE, "hta_run.py"), hta_dir(d), "--quiet"]
    out: Dict[str, Any] = {}
    for t, cmd in tools.items():
        if t == "hta" and hta_skip:
            out[t] = {"status": "timeout", "skipped": True, "wall_s": None, "peak_mib": None,
                      "note": "not run: a smaller point of this series timed out"}
            print(f"  [{p.name}] {t:12s} skipped (smaller point timed out)", file=sys.stderr)
            continue
        timeout = args.hta_timeout if t == "hta" else args.diag_timeout
        runs = []
        for _ in range(1 if t in ("hta", "summarize") else args.rounds):
            r = measure(cmd, timeout)
            r["status"] = _status(r)
            runs.append(r)
            print(f"  [{p.name}] {t:12s} {r['wall_s']:8.2f} s {r['peak_mib']:8.0f} MiB "
                  f"{r['status']}", file=sys.stderr, flush=True)
            if r["status"] not in ("ok", "timeout"):
                print("    " + (r["stderr_tail"] or r["stdout"][-400:]).strip()[-600:],
                      file=sys.stderr)
            if r["status"] == "timeout":
                break
        ok = [r for r in runs if r["status"] == "ok"]
        out[t] = {
            "status": "ok" if ok else runs[-1]["status"],
            "wall_s": statistics.median(r["wall_s"] for r in ok) if ok else None,
            "peak_mib": statistics.median(r["peak_mib"] for r in ok) if ok else None,
            "maxrss_mib": statistics.median(r["maxrss_mib"] for r in ok) if ok else None,
            "cpu_s": statistics.median(r["user_s"] + r["sys_s"] for r in ok) if ok else None,
            "runs": [{k: v for k, v in r.items() if k != "stdout"} for r in runs],
        }
        if t == "hta" and ok:
            try:
                out[t]["inner"] = json.loads(ok[0]["stdout"])["timings"]
            except (ValueError, KeyError):
                pass
    return out


# ---------------------------------------------------------------- report

def _f(x: Optional[float], spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(results: List[Dict[str, Any]]) -> str:
    hdr = ["series", "ranks", "events/rank", "events total", "MB json", "MB gz", "diag s", "diag MiB",
           "diag[w=1] s", "diag[w=1] MiB", "diag no-meta s", "diag no-meta MiB",
           "summarize s", "merge s", "merge MiB", "HTA s", "HTA MiB", "HTA/diag t", "HTA/merge t",
           "diag µs/event"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for res in results:
        s, m = res["sizes"], res["tools"]
        d, w1, h = m.get("diag", {}), m.get("diag[w=1]", {}), m.get("hta", {})
        nm, su, mg = m.get("diag[no meta]", {}), m.get("summarize", {}), m.get("merge", {})

        def cell(x, key, spec):
            if not x:
                return "n/a"
            if x.get("status") != "ok":
                return x.get("status", "-")
            return _f(x.get(key), spec)

        ratio = (h["wall_s"] / d["wall_s"]) if h.get("wall_s") and d.get("wall_s") else None
        mratio = (h["wall_s"] / mg["wall_s"]) if h.get("wall_s") and mg.get("wall_s") else None
        per_ev = (d["wall_s"] / s["events_total"] * 1e6) if d.get("wall_s") else None
        lines.append("| " + " | ".join([
            res["series"], str(res["ranks"]), str(s["events_per_rank"]), str(s["events_total"]),
            f"{s['bytes_uncompressed_est'] / 1e6:.0f}", f"{s['bytes_on_disk'] / 1e6:.1f}",
            cell(d, "wall_s", ".2f"), cell(d, "peak_mib", ".0f"),
            cell(w1, "wall_s", ".2f"), cell(w1, "peak_mib", ".0f"),
            cell(nm, "wall_s", ".2f"), cell(nm, "peak_mib", ".0f"),
            cell(su, "wall_s", ".2f"), cell(mg, "wall_s", ".2f"), cell(mg, "peak_mib", ".0f"),
            cell(h, "wall_s", ".1f"), cell(h, "peak_mib", ".0f"),
            _f(ratio, ".1f") + ("x" if ratio else ""), _f(mratio, ".1f") + ("x" if mratio else ""),
            _f(per_ev, ".2f"),
        ]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--synth-child"]:
        _synth_child(Point(**json.loads(argv[1])), argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write all results as JSON here")
    ap.add_argument("--table-from", metavar="JSON", help="only print the table of an earlier --out")
    ap.add_argument("--work", default=os.path.join(ROOT, "bench_out", "scale"),
                    help="where the synthesised jobs go (default bench_out/scale, git-ignored)")
    ap.add_argument("--regen", action="store_true", help="rebuild inputs even if present")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 8/16/32 ranks (smoke test)")
    ap.add_argument("--series", choices=("events", "ranks", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=3, help="diag runs per point (median); HTA runs once")
    ap.add_argument("--diag", help="command for diag (default: the diag next to this python)")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--hta-timeout", type=float, default=300, help="seconds per HTA point")
    ap.add_argument("--diag-timeout", type=float, default=600, help="seconds per diag run")
    ap.add_argument("--workers-min-ranks", type=int, default=64,
                    help="also run DIAG_WORKERS=1 and =N at points with at least this many ranks")
    ap.add_argument("--max-ranks", type=int, default=1024, help="leave out rank points above this")
    args = ap.parse_args(argv)
    if args.table_from:
        with open(args.table_from) as fh:
            doc = json.load(fh)
        print(table(doc["results"]))
        return 0
    env_workers = os.environ.pop("DIAG_WORKERS", None)  # "diag" must mean the default
    if env_workers is not None:
        print(f"note: ignoring DIAG_WORKERS={env_workers} from the environment for the default run",
              file=sys.stderr)
    diag_cmd = find_diag(args.diag)
    if not diag_cmd:
        print("note: no `diag` executable found; HTA only", file=sys.stderr)
    pts = [p for p in points(args.quick) if args.series in ("both", p.series) and p.ranks <= args.max_ranks]
    results, timed_out_at = [], {}
    t_all = time.perf_counter()
    for p in pts:
        d = os.path.join(args.work, p.name)
        sizes = synthesise(p, d, args.regen)
        print(f"{p.series}: {p.name} ({p.ranks} ranks, {sizes['events_per_rank']} events/rank, "
              f"{sizes['bytes_on_disk'] / 1e6:.1f} MB gz)", file=sys.stderr, flush=True)
        key = (p.series,)
        skip = key in timed_out_at and timed_out_at[key] < (p.ranks * sizes["events_per_rank"])
        tools = bench_point(p, d, args, diag_cmd, skip)
        if tools.get("hta", {}).get("status") == "timeout" and key not in timed_out_at:
            timed_out_at[key] = p.ranks * sizes["events_per_rank"]
        results.append({"series": p.series, "point": asdict(p), "name": p.name, "dir": d,
                        "ranks": p.ranks, "sizes": sizes, "tools": tools})
    tbl = table(results)
    print(tbl)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"python": sys.version.split()[0], "cpus": os.cpu_count(),
                       "rounds": args.rounds, "hta_timeout_s": args.hta_timeout,
                       "diag_cmd": diag_cmd,
                       "total_s": time.perf_counter() - t_all, "table": tbl,
                       # children's ru_maxrss cannot be below this (inherited high-water mark)
                       "parent_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
