"""benchmarks/p2p_timeline.py, the instrument behind benchmarks/README.md's late-delivery readings.

Its arithmetic on logs built by hand (which posts are slow, which waits late, which steps clean),
and a real 2-rank pipeline run of the trainer through it: every batch posted is waited, once; the
steps read are the run's less the skipped; the posts and waits lie inside their steps, in order.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MS = 1_000_000  # ns


def _tool():
    spec = importlib.util.spec_from_file_location("p2p_timeline", os.path.join(ROOT, "benchmarks", "p2p_timeline.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(tmp_path, logs):
    for r, log in logs.items():
        (tmp_path / f"p2p-rank-{r}.json").write_text(json.dumps(log))


def test_slow_posts_late_waits_and_clean_steps_worked_by_hand(tmp_path):
    # three steps of 40, 50 and 45 ms; rank 0 sends, rank 1 receives, one exchange a step.
    # step 0: all prompt. step 1: rank 0's post takes 2.0 ms of wall (0.3 ms of CPU): slow (over 1 ms),
    # and 0.5 ms over the 1.5 ms a clean step allows. step 2: rank 1's wait begins at 100 ms, the peer
    # posted at 101 ms (its post ending 101.2), and the wait ends at 104.2: 3.0 ms after the later of
    # the two: late, and 1.5 ms over.
    r0 = [("post", "fwd_send", 10 * MS, 10 * MS + 200_000, 1, 150_000, 0),
          ("wait", "fwd_send", 11 * MS, 11 * MS + 100_000, 1, 0, 0), ("step", None, 0, 40 * MS, 0, 0, 0),
          ("post", "fwd_send", 55 * MS, 57 * MS, 1, 300_000, 3),
          ("wait", "fwd_send", 57 * MS, 57 * MS + 100_000, 1, 0, 0), ("step", None, 40 * MS, 90 * MS, 0, 0, 0),
          ("post", "fwd_send", 101 * MS, 101 * MS + 200_000, 1, 150_000, 0),
          ("wait", "fwd_send", 102 * MS, 102 * MS + 100_000, 1, 0, 0), ("step", None, 90 * MS, 135 * MS, 0, 0, 0)]
    # rank 0's forwards, one a step: 8, 10 and 6 ms, of which the stage's own forward call 7, 9 and 5.5 ms
    for i, (t0, wall, core) in enumerate(((1, 8, 7), (41, 10, 9), (91, 6, 5.5))):
        at = r0.index(("step", None, *[(0, 40 * MS), (40 * MS, 90 * MS), (90 * MS, 135 * MS)][i], 0, 0, 0))
        r0[at:at] = [("core", "F", t0 * MS + 100_000, int((t0 + core) * MS) + 100_000, 1, 0, 0),
                     ("action", "F", t0 * MS, (t0 + wall) * MS, 1, int((wall - 0.5) * MS), 0)]
    r1 = [("post", "fwd_recv", 5 * MS, 5 * MS + 100_000, 1, 80_000, 0),
          ("wait", "fwd_recv", 5 * MS, 10 * MS + 300_000, 1, 0, 0), ("step", None, 0, 40 * MS, 0, 0, 0),
          ("post", "fwd_recv", 50 * MS, 50 * MS + 100_000, 1, 80_000, 0),
          ("wait", "fwd_recv", 50 * MS, 57 * MS + 200_000, 1, 0, 0), ("step", None, 40 * MS, 90 * MS, 0, 0, 0),
          ("post", "fwd_recv", 99 * MS, 99 * MS + 100_000, 1, 80_000, 0),
          ("wait", "fwd_recv", 100 * MS, 104 * MS + 200_000, 1, 0, 0), ("step", None, 90 * MS, 135 * MS, 0, 0, 0)]
    _write(tmp_path, {0: r0, 1: r1})
    res = _tool().analyse(str(tmp_path), skip=0)
    sched = res["ranks"][0].pop("schedule_ms")
    # rank 0's actions are forwards only: no backward over them
    assert res["ranks"][0].pop("by_kind_ms") == pytest.approx({"F": 8.0, "B": 0.0, "W": 0.0})
    assert res["ranks"][0].pop("backward_per_forward") == 0.0
    assert res["ranks"][0] == {"posts": 3, "slow_posts": 1, "waits": 3, "late": 0,
                               "slow_post_cpu_ms": pytest.approx(0.3), "slow_post_switches": 3}
    # each part's median over the three steps; the rest: 40 - 8 - 0.2 - 0.1, 50 - 10 - 2 - 0.1, 45 - 6 - 0.2 - 0.1
    assert sched == pytest.approx({"actions": 8.0, "action_cpu": 7.5, "core": 7.0, "posts": 0.2, "waits": 0.1,
                                   "rest": 37.9, "n_actions": 1})
    # rank 1 waits 5.3, 7.2 and 4.2 ms; the rest 40 - 0.1 - 5.3, 50 - 0.1 - 7.2, 45 - 0.1 - 4.2
    assert res["ranks"][1]["schedule_ms"] == pytest.approx({"actions": 0.0, "action_cpu": 0.0, "core": 0.0,
                                                            "posts": 0.1, "waits": 5.3, "rest": 40.7,
                                                            "n_actions": 0})
    assert res["ranks"][1]["slow_posts"] == 0 and res["ranks"][1]["late"] == 1
    assert (res["steps"], res["clean_steps"]) == (3, 1)
    assert res["step_ms"] == pytest.approx(45.0) and res["clean_step_ms"] == pytest.approx(40.0)
    assert _tool().analyse(str(tmp_path), skip=1)["steps"] == 2
    # step 1's wait on rank 1 ends 0.2 ms after the peer's post: prompt
    res["ranks"][0]["schedule_ms"] = sched
    assert "1 over 1 ms late" in _tool().report(res)
    assert "rank 0, schedule.step, medians a step: 1 actions 8.0 ms (7.5 ms CPU; the stage's forward/backward " \
           "calls in them 7.0 ms), posts 0.2, waits 0.1, the rest 37.9 ms" in _tool().report(res)


def test_actions_by_kind_worked_by_hand(tmp_path):
    """Three steps. Rank 0 (the first stage under zero bubble): forward 10, 10, 8 ms; input gradients
    0.1 ms (none to compute), weight gradients 20, 22, 16.9 ms: backward over forward (0.1 + 20) / 10 =
    2.01, 2.21, 17 / 8 = 2.125; median 2.125. Rank 1 (1F1B): forward 10, 12, 11; backward 19, 24, 22: 1.9, 2.0,
    2.0, and a fourth step with no action, which has no ratio: median 2.0 (its kinds' medians over the four
    steps: forward 10.5, backward 20.5)."""
    def step(t, f, b, w=None):
        acts = [("action", "F", t * MS, int((t + f) * MS), 1, 0, 0),
                ("action", "B", (t + 20) * MS, int((t + 20 + b) * MS), 1, 0, 0)]
        if w is not None:
            acts.append(("action", "W", (t + 40) * MS, int((t + 40 + w) * MS), 1, 0, 0))
        return acts + [("step", None, t * MS, (t + 100) * MS, 0, 0, 0)]
    r0 = step(0, 10, 0.1, 20) + step(100, 10, 0.1, 22) + step(200, 8, 0.1, 16.9)
    r1 = step(0, 10, 19) + step(100, 12, 24) + step(200, 11, 22) + [("step", None, 300 * MS, 400 * MS, 0, 0, 0)]
    _write(tmp_path, {0: r0, 1: r1})
    res = _tool().analyse(str(tmp_path), skip=0)
    assert res["ranks"][0]["backward_per_forward"] == pytest.approx(2.125)
    assert res["ranks"][0]["by_kind_ms"] == pytest.approx({"F": 10.0, "B": 0.1, "W": 20.0})
    assert res["ranks"][1]["backward_per_forward"] == pytest.approx(2.0)
    assert res["ranks"][1]["by_kind_ms"] == pytest.approx({"F": 10.5, "B": 20.5, "W": 0.0})
    assert "rank 0, actions by kind, medians a step: forward 10.0 ms, backward 0.1 ms, weight gradients 20.0 " \
           "ms; backward (with its weight gradients) over forward 2.125" in _tool().report(res)


def test_a_real_pipeline_run_through_it(tmp_path):
    out = tmp_path / "run"
    job = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
           "--vocab-size", "64", "--train-iters", "6", "--nproc", "2", "--pipeline-model-parallel-size", "2",
           "--micro-batch-size", "2", "--global-batch-size", "8", "--no-trace-summary", "--no-profile",
           "--no-metrics"]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "p2p_timeline.py"), "--out", str(out),
                        "--skip", "1", "--", *job], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads((out / "p2p_timeline.json").read_text())
    assert res["steps"] == 5                                      # six steps, the first skipped
    assert "5 steps: median" in p.stdout
    for r in (0, 1):
        log = json.loads((out / f"p2p-rank-{r}.json").read_text())
        steps = [e for e in log if e[0] == "step"]
        assert len(steps) == 6
        posted = [e for e in log if e[0] == "post" and e[4]]
        assert posted and len(posted) == len([e for e in log if e[0] == "wait" and e[4]])
        assert res["ranks"][str(r)]["posts"] == len([e for e in posted if e[2] >= steps[1][2]])
        # each post and wait inside its step, after its step's start, in time order
        bounds = iter(steps)
        s = next(bounds)
        last = 0
        spans: list = []                      # the step's actions, posts and waits
        for e in log:
            if e[0] == "step":
                # the parts schedule.step is split into never overlap: the rest between them is >= 0
                spans.sort()
                assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
                spans = []
                s = next(bounds, None)
                continue
            assert s[2] <= e[2] <= e[3] <= s[3]
            if e[0] in ("post", "wait"):
                assert e[2] >= last
                last = e[2]
            if e[0] != "core":
                spans.append((e[2], e[3]))
        # four micro-batches, one stage a rank: a forward and a backward each, a step; the stage's own
        # calls inside them
        sched = res["ranks"][str(r)]["schedule_ms"]
        assert sched["n_actions"] == 8
        assert 0 < sched["core"] <= sched["actions"]
        assert sched["rest"] >= 0
