"""Coverage-guided fuzzing (atheris) of the loader and every analysis, seeded with slices of the
real traces in tests/data; the harness is tests/fuzz_atheris.py. Bounded by time
(DIAG_FUZZ_SECONDS, default 60), run in its own process; a crash, a hang (-timeout) or a memory
blow-up (-rss_limit_mb) fails the test, showing the input libFuzzer saved. Counts are printed in
pytest's summary (conftest.py)."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import DATA, ROOT

pytest.importorskip("atheris", reason="atheris has wheels for Linux x86-64 only (the dev extra installs it there)")

HERE = os.path.dirname(os.path.abspath(__file__))
SECONDS = int(os.environ.get("DIAG_FUZZ_SECONDS", "60"))
MAX_LEN = 32768
RESULT: dict = {}


def _slice(doc: dict, per_cat: int = 12) -> dict:
    """The trace's header and its first events of each category (steps, kernels, NCCL, ...),
    kept in order: a seed small enough to mutate quickly that still reaches every analysis."""
    seen: dict = {}
    events = []
    for e in doc.get("traceEvents") or []:
        cat = e.get("cat") if isinstance(e, dict) else None
        if seen.get(cat, 0) < per_cat:
            seen[cat] = seen.get(cat, 0) + 1
            events.append(e)
    return {**{k: v for k, v in doc.items() if k != "traceEvents"}, "traceEvents": events}


def make_seeds(out: str) -> int:
    os.makedirs(out)
    n = 0
    for folder in sorted(os.listdir(DATA)):
        path = os.path.join(DATA, folder)
        if not os.path.isdir(path):
            continue
        first = sorted(f for f in os.listdir(path) if f.endswith((".json", ".json.gz")))[0]
        with open(os.path.join(path, first), "rb") as f:
            raw = f.read()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        for per_cat in (12, 4):
            seed = json.dumps(_slice(doc, per_cat)).encode()
            if len(seed) <= MAX_LEN:
                break
        with open(os.path.join(out, f"{folder}.json"), "wb") as f:
            f.write(seed[:MAX_LEN])
        n += 1
    return n


def test_atheris_finds_no_crash_hang_or_memory_blowup(tmp_path):
    seeds, corpus, counts = tmp_path / "seeds", tmp_path / "corpus", tmp_path / "counts.json"
    assert make_seeds(str(seeds)) >= 8
    corpus.mkdir()
    cmd = [sys.executable, os.path.join(HERE, "fuzz_atheris.py"), f"-max_total_time={SECONDS}",
           f"-max_len={MAX_LEN}", "-timeout=20", "-rss_limit_mb=2048", "-print_final_stats=1",
           f"-dict={os.path.join(HERE, 'fuzz_kineto.dict')}", f"-artifact_prefix={tmp_path}/",
           str(corpus), str(seeds)]
    # libFuzzer's -rss_limit_mb reads ru_maxrss, which survives exec: started straight from this test
    # process, the fuzzer began with pytest's own peak (2.8 GB late in a full run: an "oom" before any
    # input had grown). A small process in between forks it, so it starts from its own memory.
    cmd = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=SECONDS + 300, cwd=ROOT,
                       env={**os.environ, "DIAG_FUZZ_COUNTS": str(counts)})
    found = [f for f in os.listdir(tmp_path) if f.startswith(("crash-", "timeout-", "oom-", "leak-"))]
    assert p.returncode == 0 and not found, \
        f"atheris exited {p.returncode}, saved {[str(tmp_path / f) for f in found]} (replay: python " \
        f"tests/fuzz_atheris.py FILE):\n{p.stdout[-3000:]}\n" + "\n".join(p.stderr.splitlines()[-15:])
    runs = int(re.search(r"Done (\d+) runs in (\d+) second", p.stderr).group(1))
    cov = [int(x) for x in re.findall(r"cov: (\d+)", p.stderr)]
    c = json.loads(counts.read_text())
    RESULT.update(runs=runs, seconds=SECONDS, coverage=cov[-1], corpus=len(os.listdir(corpus)), **c)
    assert runs >= 200, p.stderr[-2000:]                     # it really ran
    assert c["diagnosed"] > 0 and c["rejected"] > 0          # both outcomes were reached
    assert cov[-1] > cov[0]                                  # and it found new code along the way
