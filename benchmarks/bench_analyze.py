#!/usr/bin/env python3
"""Benchmark `diag analyze` against HTA and against the JSON-parsing floor, whole process.

For each input trace this runs, each in its own child process, alternating and repeated
(--rounds, median reported):

  diag   `diag analyze FILE --format json --output /dev/null`
  hta    `benchmarks/hta_run.py FILE` (HTA 0.5.0: load + temporal breakdown + comm/comp overlap)
  floor  decompress + parse the JSON and nothing else, once per parser available
         (orjson, msgspec, pysimdjson; stdlib json with --with-stdlib); the fastest is the floor.
         pysimdjson builds simdjson's tape without materialising Python objects, so it is the
         true lower bound of "parse the JSON"; orjson/msgspec build the full Python object tree.

Measurement: wall time from fork to reaping of the child (interpreter start-up and imports
included), and peak RSS of the child from the rusage that os.wait4() returns for that one child
(ru_maxrss, the high-water mark of that process; a child that forks workers reports the largest
of them, not their sum). Because os.wait4 reports exactly the reaped child, there is none of the
RUSAGE_CHILDREN "max over all children so far" problem. In one more run per tool and input, not
timed, a psutil sampler (every 50 ms) also records the peak of the summed RSS of the child's whole
process tree, which matters when a tool forks workers (diag's decoders, HTA's pool for several
ranks); the table uses max(ru_maxrss, tree peak), the tree summed as PSS (shared pages split among
the processes sharing them) so forked workers' copy-on-write pages are not counted twice. The
sampler is kept out of the timed runs: reading every process's page tables costs CPU and holds
its memory map lock, which a tool that uses every core pays in wall time (diag on x6: 303 ms
without it, 314 ms with it; the single-threaded floor 212 and 217 ms).

Output: a table on stdout and, with --out, all runs and medians as JSON.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PARSERS = ("simdjson", "orjson", "msgspec", "json")
# Children write and reuse bytecode as a user's Python does: with PYTHONDONTWRITEBYTECODE set
# (some shells and CI images set it) every run of diag compiles its own modules again (~0.1 s).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


# ---------------------------------------------------------------- floor (child-process mode)

def _floor_child(parser: str, path: str) -> None:
    """Decompress + parse PATH with PARSER; print timings and the event count as JSON."""
    t0 = time.perf_counter()
    if path.endswith(".gz"):
        try:
            from isal import igzip  # ISA-L: the fastest gzip decompressor we know of
            data = igzip.decompress(open(path, "rb").read())
            gz = "isal"
        except ImportError:
            data = gzip.decompress(open(path, "rb").read())
            gz = "zlib"
    else:
        with open(path, "rb") as fh:
            data = fh.read()
        gz = None
    t1 = time.perf_counter()
    if parser == "orjson":
        import orjson
        doc = orjson.loads(data)
        n = len(doc["traceEvents"])
    elif parser == "msgspec":
        import msgspec
        doc = msgspec.json.decode(data)
        n = len(doc["traceEvents"])
    elif parser == "simdjson":
        import simdjson
        doc = simdjson.Parser().parse(data)  # tape only; proxies are lazy
        n = len(doc["traceEvents"])
    elif parser == "json":
        doc = json.loads(data)
        n = len(doc["traceEvents"])
    else:
        raise SystemExit(f"unknown parser {parser}")
    t2 = time.perf_counter()
    print(json.dumps({"parser": parser, "gunzip": gz, "bytes": len(data), "events": n,
                      "decompress_s": t1 - t0, "parse_s": t2 - t1}))


def _parser_available(name: str) -> bool:
    mod = {"simdjson": "simdjson", "orjson": "orjson", "msgspec": "msgspec", "json": "json"}[name]
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


# ---------------------------------------------------------------- measuring one child

def _tree_rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p] + p.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        try:
            # PSS, not RSS: forked workers share the parent's pages (diag's and HTA's pools
            # both fork); RSS would count every shared page once per process.
            total += q.memory_full_info().pss
        except (psutil.Error, AttributeError):
            try:
                total += q.memory_info().rss
            except psutil.Error:
                pass
    return total


def measure(cmd: List[str], timeout: float, capture: bool = True,
            kill_above_mib: Optional[float] = None, sample: bool = True) -> Dict[str, Any]:
    """Run CMD; return wall seconds, peak RSS (MiB) and its output. kill_above_mib: kill it once
    its process tree holds more than this (a tool that would take the machine's memory).
    sample=False: no sampler of the tree's memory (peak from wait4's ru_maxrss alone). The sampler
    reads every process's page tables (PSS) every 50 ms, which costs CPU and holds the process's
    memory map lock: a child that uses every core pays it in wall time, one that uses one does not."""
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=out if capture else subprocess.DEVNULL, stderr=err,
                            cwd=ROOT, env=CHILD_ENV)
    peak_tree = 0
    over_limit = False
    stop = threading.Event()

    def sample_tree() -> None:
        nonlocal peak_tree, over_limit
        while not stop.is_set():
            peak_tree = max(peak_tree, _tree_rss(proc.pid))
            if kill_above_mib and peak_tree > kill_above_mib * 2**20 and not over_limit:
                over_limit = True
                proc.kill()
            stop.wait(0.05)

    sampler = threading.Thread(target=sample_tree, daemon=True)
    if sample:
        sampler.start()
    reaped: Dict[str, Any] = {}

    def reap() -> None:  # blocking wait4 in a thread: no busy polling stealing a core
        reaped["pid"], reaped["status"], reaped["ru"] = os.wait4(proc.pid, 0)
        reaped["t"] = time.perf_counter()

    reaper = threading.Thread(target=reap, daemon=True)
    reaper.start()
    reaper.join(timeout)
    timed_out = reaper.is_alive()
    if timed_out:
        proc.kill()
        reaper.join()
    status, ru = reaped["status"], reaped["ru"]
    wall = reaped["t"] - t0
    stop.set()
    if sample:
        sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    stdout = out.read().decode(errors="replace") if capture else ""
    stderr = err.read().decode(errors="replace")
    maxrss_mib = ru.ru_maxrss / 1024.0  # Linux: KiB
    return {
        "cmd": cmd,
        "rc": proc.returncode,
        "timed_out": timed_out,
        "over_memory_limit": over_limit,
        "wall_s": wall,
        "user_s": ru.ru_utime,
        "sys_s": ru.ru_stime,
        "maxrss_mib": maxrss_mib,
        "tree_peak_mib": peak_tree / 2**20,
        "peak_mib": max(maxrss_mib, peak_tree / 2**20),
        "stdout": stdout[-4000:],
        "stderr_tail": stderr[-1500:],
    }


# ---------------------------------------------------------------- the benchmark

def find_diag(explicit: Optional[str]) -> Optional[List[str]]:
    if explicit:
        return explicit.split()
    cand = os.path.join(os.path.dirname(sys.executable), "diag")
    if os.path.exists(cand):
        return [cand]
    which = shutil.which("diag")
    return [which] if which else None


def uncompressed_size(path: str) -> int:
    if not path.endswith(".gz"):
        return os.path.getsize(path)
    n = 0
    with gzip.open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            n += len(chunk)
    return n


def tools_for(path: str, args, diag_cmd) -> Dict[str, List[str]]:
    py = sys.executable
    tools: Dict[str, List[str]] = {}
    if diag_cmd:
        tools["diag"] = diag_cmd + ["analyze", path, "--format", "json", "--output", os.devnull]
    if not args.skip_hta:
        tools["hta"] = [py, os.path.join(HERE, "hta_run.py"), path, "--quiet"]
    for p in args.parsers:
        tools["floor:" + p] = [py, os.path.abspath(__file__), "--floor-child", p, path]
    return tools


def median_of(runs: List[Dict[str, Any]], key: str) -> Optional[float]:
    ok = [r[key] for r in runs if r["rc"] == 0 and not r["timed_out"]]
    return statistics.median(ok) if ok else None


def bench_one(path: str, args, diag_cmd) -> Dict[str, Any]:
    tools = tools_for(path, args, diag_cmd)
    runs: Dict[str, List[Dict[str, Any]]] = {t: [] for t in tools}
    names = list(tools)
    if "diag" in tools:
        measure(tools["diag"], args.timeout)      # warm-up, untimed: bytecode written, page cache
    for rnd in range(args.rounds):
        order = names if rnd % 2 == 0 else names[::-1]  # alternate to spread cache/thermal bias
        for t in order:
            r = measure(tools[t], args.timeout, sample=False)
            r["round"] = rnd
            runs[t].append(r)
            status = "ok" if r["rc"] == 0 else f"rc={r['rc']}"
            print(f"  [{os.path.basename(path)} round {rnd}] {t:15s} {r['wall_s']:8.2f} s "
                  f"{r['peak_mib']:8.0f} MiB  {status}", file=sys.stderr, flush=True)
            if r["rc"] != 0:
                print("    " + r["stderr_tail"].strip().replace("\n", "\n    ")[-800:],
                      file=sys.stderr)
    # The memory of the whole process tree, sampled in one more run per tool: in the timed runs the
    # sampler would slow a tool that uses every core (measure's sample)
    mem = {t: measure(tools[t], args.timeout) for t in names}
    summary: Dict[str, Any] = {}
    for t, rs in runs.items():
        for r in rs:
            r["cpu_s"] = r["user_s"] + r["sys_s"]
        peaks = [x for x in (median_of(rs, "peak_mib"), median_of([mem[t]], "peak_mib")) if x is not None]
        summary[t] = {"wall_s": median_of(rs, "wall_s"), "peak_mib": max(peaks) if peaks else None,
                      "cpu_s": median_of(rs, "cpu_s"), "tree_peak_mib": mem[t]["tree_peak_mib"],
                      "ok_runs": sum(r["rc"] == 0 and not r["timed_out"] for r in rs)}
        if t == "hta":  # HTA's own split of the time, from hta_run.py's JSON
            inner = []
            for r in rs:
                try:
                    inner.append(json.loads(r["stdout"])["timings"])
                except (ValueError, KeyError):
                    pass
            if inner:
                summary[t]["inner"] = {k: statistics.median(d[k] for d in inner)
                                       for k in inner[0]}
        if t.startswith("floor:"):
            inner = []
            for r in rs:
                try:
                    inner.append(json.loads(r["stdout"].strip().splitlines()[-1]))
                except (ValueError, IndexError):
                    pass
            if inner:
                summary[t]["events"] = inner[0]["events"]
                summary[t]["decompress_s"] = statistics.median(d["decompress_s"] for d in inner)
                summary[t]["parse_s"] = statistics.median(d["parse_s"] for d in inner)
    floors = {t: s for t, s in summary.items() if t.startswith("floor:") and s["wall_s"]}
    best = min(floors, key=lambda t: floors[t]["wall_s"]) if floors else None
    events = next((s.get("events") for s in floors.values() if s.get("events")), None)
    return {"input": path, "bytes_uncompressed": uncompressed_size(path),
            "bytes_on_disk": os.path.getsize(path), "events": events,
            "floor_parser": best.split(":", 1)[1] if best else None,
            "summary": summary,
            "runs": {t: [{k: v for k, v in r.items() if k != "stdout"} for r in rs]
                     for t, rs in runs.items()}}


def _short(path: str, width: int = 36) -> str:
    name = os.path.basename(path)
    return name if len(name) <= width else name[:width - 13] + "..." + name[-10:]


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _fmt(x: Optional[float], spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def table(results: List[Dict[str, Any]]) -> str:
    hdr = ("input", "MB", "events", "diag s", "diag MiB", "HTA s", "HTA MiB", "floor s",
           "floor MiB", "HTA/diag t", "diag/HTA mem", "diag/floor t")
    rows = [hdr]
    for res in results:
        s = res["summary"]
        d, h = s.get("diag", {}), s.get("hta", {})
        f = s.get("floor:" + res["floor_parser"], {}) if res["floor_parser"] else {}
        rows.append((
            _short(res["input"]), f"{res['bytes_uncompressed'] / 1e6:.1f}",
            str(res["events"] or "-"),
            _fmt(d.get("wall_s"), ".2f"), _fmt(d.get("peak_mib"), ".0f"),
            _fmt(h.get("wall_s"), ".2f"), _fmt(h.get("peak_mib"), ".0f"),
            _fmt(f.get("wall_s"), ".2f") + (f" ({res['floor_parser']})" if f else ""),
            _fmt(f.get("peak_mib"), ".0f"),
            _fmt(_ratio(h.get("wall_s"), d.get("wall_s")), ".1f") + "x",
            _fmt(_ratio(d.get("peak_mib"), h.get("peak_mib")), ".2f"),
            _fmt(_ratio(d.get("wall_s"), f.get("wall_s")), ".2f") + "x",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(hdr))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines)
    # every parser, so the choice of floor is visible
    extra = []
    for res in results:
        for t, sm in res["summary"].items():
            if t.startswith("floor:") and sm["wall_s"]:
                extra.append(f"  {_short(res['input'])} {t[6:]:9s} wall "
                             f"{sm['wall_s']:.2f} s (decompress {sm.get('decompress_s', 0):.2f}"
                             f" + parse {sm.get('parse_s', 0):.2f}), peak {sm['peak_mib']:.0f} MiB")
        h = res["summary"].get("hta", {}).get("inner")
        if h:
            extra.append(f"  {_short(res['input'])} HTA inside: load {h['load_s']:.2f}"
                         f" s, breakdown {h['breakdown_s']:.2f} s, overlap {h['overlap_s']:.2f} s")
    for res in results:
        cpu = {t: sm.get("cpu_s") for t, sm in res["summary"].items() if sm.get("cpu_s")}
        if cpu:
            extra.append(f"  {_short(res['input'])} CPU s (user+sys): "
                         + ", ".join(f"{t} {v:.2f}" for t, v in cpu.items()))
    # linearity: seconds per million events, per tool
    if len(results) >= 2 and all(r["events"] for r in results):
        for t in ("diag", "hta"):
            per = [(r["events"], r["summary"].get(t, {}).get("wall_s")) for r in results]
            if all(w for _, w in per):
                extra.append(f"  {t}: " + ", ".join(f"{w / (n / 1e6):.2f} s/M events at {n}"
                                                    for n, w in per))
    return out + ("\n\n" + "\n".join(extra) if extra else "")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--floor-child"]:
        _floor_child(argv[1], argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="trace files (.json or .json.gz)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write all results as JSON here")
    ap.add_argument("--diag", help="command for diag (default: the diag next to this python)")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--with-stdlib", action="store_true", help="also time stdlib json")
    ap.add_argument("--timeout", type=float, default=1800, help="per child, seconds")
    args = ap.parse_args(argv)
    args.parsers = [p for p in PARSERS if (p != "json" or args.with_stdlib)
                    and _parser_available(p)]
    diag_cmd = find_diag(args.diag)
    if not diag_cmd:
        print("note: no `diag` executable found; benchmarking HTA and the floor only",
              file=sys.stderr)
    results = [bench_one(os.path.abspath(p), args, diag_cmd) for p in args.inputs]
    print(table(results))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"python": sys.version.split()[0], "cpus": os.cpu_count(),
                       "rounds": args.rounds, "diag_cmd": diag_cmd, "parsers": args.parsers,
                       "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
