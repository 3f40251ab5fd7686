"""Coverage-guided fuzzing of the trace loader and the analyses (atheris: libFuzzer for Python).

Where tests/test_fuzz_loader.py (hypothesis) generates malformed traces from a grammar, this
mutates bytes of real traces and keeps the mutants that reach new code in diag (its modules are
instrumented for coverage), so it finds paths a grammar does not think of. Each input is written
as one trace file and goes the way a user's does: load_job -> diagnose -> every renderer. It must
end in a Diagnosis or a TraceError naming the file; any other exception is a crash (libFuzzer
stops, saves the input as crash-<sha1> under -artifact_prefix and exits non-zero); an input
running past -timeout seconds is a hang, and the process passing -rss_limit_mb is a memory bug.

    .venv/bin/python tests/fuzz_atheris.py -runs=5000 -max_len=32768 -timeout=20 \\
        -dict=tests/fuzz_kineto.dict NEW_CORPUS_DIR SEED_DIR

tests/test_fuzz_atheris.py makes the seeds (slices of every real trace in tests/data) and runs
this for a bounded time in CI. Counts go to $DIAG_FUZZ_COUNTS after every input, since
libFuzzer ends the process without running Python's exit handlers.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["diag"]):
    from diag.analysis import diagnose
    from diag.advise.recommend import with_advice
    from diag.report import render
    from diag.trace import TraceError, load_job

WORK = tempfile.mkdtemp(prefix="diag-atheris-")
TRACE = os.path.join(WORK, "rank0.json")
COUNTS = {"inputs": 0, "diagnosed": 0, "rejected": 0}
COUNTS_FILE = os.environ.get("DIAG_FUZZ_COUNTS")


def _save_counts() -> None:
    if COUNTS_FILE:
        with open(COUNTS_FILE, "w") as f:
            json.dump(COUNTS, f)


def one_input(data: bytes) -> None:
    COUNTS["inputs"] += 1
    with open(TRACE, "wb") as f:
        f.write(data)
    try:
        job = load_job(TRACE)
    except TraceError as e:
        if e.path != TRACE or not e.problem:
            raise AssertionError(f"TraceError without the file or the problem: {e!r}") from e
        COUNTS["rejected"] += 1
    else:
        d = with_advice(diagnose(job))
        for fmt in ("text", "json", "markdown"):
            render(d, fmt)
        COUNTS["diagnosed"] += 1
    _save_counts()                # every input (~20 µs): the process may end after any of them


def main() -> None:
    os.environ.setdefault("DIAG_WORKERS", "1")      # one process: libFuzzer watches this one
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
