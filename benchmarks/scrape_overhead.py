"""What being scraped costs the trainer in step time.

The same job (PP 2 on 2 ranks, the exporter on in every run) run `--repeats` times unscraped and
`--repeats` times scraped `--per-second` times a second per rank, alternating so that drift of a
shared machine hits both equally. Prints the median step of each run, the ratio of the scraped
runs' median to the unscraped ones', and the noise: the spread of the unscraped runs among
themselves. A ratio inside the noise is no measured cost.

On a machine with as many cores as ranks the scraper's own CPU (this process) competes with
training, so the ratio is an upper bound on what a Prometheus server on another machine costs.

    python benchmarks/scrape_overhead.py [--repeats 3] [--per-second 20] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from promserver import finish, free_ports, iters_lasting, scrape, start_trainer  # noqa: E402

SKIP_STEPS = 10  # start-up steps are not measured


def run(out: Path, iters: int, per_second: float | None) -> tuple[float, int]:
    """Median step of one run, and the scrapes answered (both ranks together)."""
    port = free_ports(2)
    stop, seen = threading.Event(), {}
    thread = threading.Thread(target=scrape, args=([port, port + 1], stop, seen, per_second or 1))
    proc = start_trainer(out, port, iters)
    if per_second:
        thread.start()
    code, _, err = finish(proc, timeout=600)
    stop.set()
    if per_second:
        thread.join(timeout=10)
    if code != 0:
        raise SystemExit(f"trainer run {out} failed ({code}): {err[-3000:]}")
    steps = [json.loads(x)["step_seconds"] for x in (out / "steps.jsonl").read_text().split()]
    return statistics.median(steps[SKIP_STEPS:]), sum(len(v) for v in seen.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--per-second", type=float, default=20.0, help="scrapes a second per rank")
    p.add_argument("--seconds", type=float, default=5.0, help="about how long each run lasts")
    args = p.parse_args()
    quiet, loaded, scrapes = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        iters = iters_lasting(args.seconds, Path(tmp) / "calibrate", 80)
        for i in range(args.repeats):
            print(f"round {i + 1}/{args.repeats} ({iters} steps a run)", file=sys.stderr)
            quiet.append(run(Path(tmp) / f"quiet{i}", iters, None)[0])
            median, answered = run(Path(tmp) / f"scraped{i}", iters, args.per_second)
            loaded.append(median)
            scrapes.append(answered)
    ratio = statistics.median(loaded) / statistics.median(quiet)
    print(json.dumps({
        "steps_a_run": iters, "scrapes_per_second_per_rank": args.per_second,
        "scrapes_answered": scrapes,
        "median_step_seconds_unscraped": [round(x, 5) for x in quiet],
        "median_step_seconds_scraped": [round(x, 5) for x in loaded],
        "ratio_scraped_unscraped": round(ratio, 3),
        "noise_unscraped_spread": round(max(quiet) / min(quiet) - 1, 3),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
