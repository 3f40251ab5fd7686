"""A hang seen live: a real Prometheus scrapes a real 2-rank DP job in which rank 1 stalls; the
Flight Recorder sequence numbers show rank 1 behind its DP group (by what its dumps say), the hang alert's
condition picks rank 1 alone, the Grafana panels of the row have data, and the dumps taken on
SIGUSR1 name the same group (its pg label) in `diag analyze`.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from diag.analysis.flightrec import flight_record
from promserver import PROM_DIR, ROOT, TINY, _kill, free_ports, prometheus_server, query
from trainer.test_faults import _child_with_rank

pytestmark = pytest.mark.slow
JOB, STALL_STEP = "hangtest", 30
ROW = "Collectives in flight (Flight Recorder)"


def _row_queries() -> list[str]:
    panels = json.loads((ROOT / "dashboards" / "grafana" / "diag.json").read_text())["panels"]
    start = next(i for i, p in enumerate(panels) if p["title"] == ROW)
    return [t["expr"].replace("$job", JOB).replace("$node", ".*") for p in panels[start + 1:start + 3]
            for t in p["targets"]]


def test_stalled_rank_is_behind_its_group_live(tmp_path):
    base = free_ports(2)
    with prometheus_server(tmp_path, [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]) as url:
        cmd = [sys.executable, "-m", "instrumented_trainer", "--nproc", "2", "--train-iters", "100000",
               "--no-profile", "--no-metrics", "--prometheus-port", str(base), "--prometheus-job", JOB,
               "--fault-stall", f"1:{STALL_STEP}:600", "--out", str(tmp_path / JOB), *TINY]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            behind = _wait_hung(url, proc)
            # rank 1 alone, on the DP group (how far rank 0 got is checked against the dumps below)
            assert [(r["metric"]["rank"], r["metric"]["axis"]) for r in behind] == [("1", "dp")], behind
            pg = behind[0]["metric"]["pg"]
            for expr in _row_queries():
                assert query(url, expr), expr
            alert = next(r for g in yaml.safe_load((PROM_DIR / "rules" / "diag-alerts.yml").read_text())["groups"]
                         for r in g["rules"] if r.get("alert") == "DiagCollectiveHang")
            # its condition, with the 5-minute stillness window cut to 10 s for the test
            cond = alert["expr"].replace("job_pg_rank:diag_collective_last_enqueued_seq:changes5m",
                                         "changes(diag_collective_last_enqueued_seq[10s])")
            fired = query(url, cond.replace("job_pg_rank:diag_collective_seq_behind",
                                            f'job_pg_rank:diag_collective_seq_behind{{job="{JOB}"}}'))
            assert [(r["metric"]["rank"], r["metric"]["pg"]) for r in fired] == [("1", pg)]
            launcher = psutil.Process(proc.pid)
            for r in (0, 1):
                _child_with_rank(launcher, r).send_signal(signal.SIGUSR1)
            dumps = [tmp_path / JOB / "flightrec" / f"rank-{r}.json" for r in (0, 1)]
            deadline = time.monotonic() + 60
            while not all(d.exists() for d in dumps) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            _kill(proc)
    fr, problems = flight_record(str(tmp_path / JOB))
    assert not problems and [(g.pg, g.missing) for g in fr.hangs] == [(pg, [1])]
    # Truth: the collectives rank 0 entered past rank 1's last, from the dumps' own status of that group
    # (taken after the query, the job hung all along): the live metric is the same number
    seq = [_last_enqueued(d, pg) for d in dumps]
    assert seq[0] > seq[1] and float(behind[0]["value"][1]) == seq[0] - seq[1], (behind, seq)


def _last_enqueued(dump, pg: str) -> int:
    """The last collective a rank entered in process group `pg` (its name), from its dump's pg_status."""
    d = json.loads(dump.read_text())
    ids = {str(e["pg_id"]) for e in d["entries"] if e["process_group"][0] == pg}
    (pg_id,) = ids
    return int(d["pg_status"][pg_id]["last_enqueued_collective"])


def _wait_hung(url: str, proc, limit_s: float = 240.0) -> list[dict]:
    """The behind series once steps stopped for 10 s with rank 1 behind (the stall), read the same
    twice 3 s apart (three scrape and evaluation intervals) with both ranks' sequence numbers
    scraped in the last 3 s: a series the rule recorded from one rank's fresh sample and the other's
    older one (the ranks' scrapes are up to an interval apart; a training rank moves ~2 collectives a
    step) is not the hang's."""
    deadline = time.monotonic() + limit_s
    expr = f'job_pg_rank:diag_collective_seq_behind{{job="{JOB}"}} > 0'
    fresh = f'count(timestamp(diag_collective_last_enqueued_seq{{job="{JOB}"}}) > time() - 3)'
    seen = None
    while time.monotonic() < deadline and proc.poll() is None:
        steps = query(url, f'max(diag_steps_total{{job="{JOB}"}})')
        still = query(url, f'changes(diag_steps_total{{job="{JOB}"}}[10s]) == 0')
        both = query(url, fresh)
        if steps and float(steps[0]["value"][1]) >= STALL_STEP and len(still) == 2 and both \
                and float(both[0]["value"][1]) == 2:
            behind = query(url, expr)
            now = [(r["metric"], r["value"][1]) for r in behind]
            if behind and now == seen:
                return behind
            seen = now
            time.sleep(3.0)
            continue
        seen = None
        time.sleep(1.0)
    pytest.fail(f"the job never hung (trainer exit {proc.poll()})")
