"""The pipeline's sends and receives in a trainer run's every step, traced or not, on one clock.

Runs the trainer (`python -m instrumented_trainer` flags after `--`, a 2-rank pipeline job) with
torch.distributed.pipelining's `_batch_p2p` and `_wait_batch_p2p` wrapped in each rank to record
when each batch of sends and receives was posted, how long the post took (wall, this thread's CPU,
its involuntary context switches) and when its wait ended (time.monotonic_ns, one clock for both
ranks of a host). No profiler is needed, so the steps it reads are the untraced ones the bench
measures. Then, over the steps after --skip:

  posts      batches posted, and those whose post took over 1 ms of wall time (a post is ~0.3 ms
             of CPU: the rest is the thread waiting for a core);
  late       waits that ended over 1 ms after the later of their own start and the other rank's
             last post before their end: the data was there to send, and came late;
  steps      the median step, over all steps and over the "clean" ones (no post or wait of either
             rank over 1.5 ms beyond those bounds): what the late ones cost the step;
  schedule   per rank, `schedule.step` split, each part's median over the steps: its actions (each stage's
             forward_one_chunk / backward_one_chunk / backward_weight_one_chunk, wall and CPU),
             the stage's own forward/backward calls inside them (the rest of an action is the
             stage's bookkeeping), the posts, the waits, and the rest: the schedule's own host
             work between them (the last stage's loss too).
  by kind   per rank, the actions' wall time a step by kind (forward, backward or the zero-bubble
             schedule's input gradients, its weight gradients) and the backward with its weight
             gradients over the forward, the median of the steps': what the split backward costs
             over the fused one, run against the same job under 1F1B.

    python benchmarks/p2p_timeline.py --out DIR -- --nproc 2 --pipeline-model-parallel-size 2 ...

The wrappers wrap whatever the trainer's communication tap put there (installed on the first step).
A benchmark's instrument, not the trainer's: benchmarks/README.md (issue #19) has its readings.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import shlex
import statistics as st
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = "P2P_TIMELINE_OUT"


def _install(out: str) -> None:
    """In a rank: wrap pipelining's post and wait of its p2p batches, dump the log at exit."""
    import atexit
    import resource

    from torch.distributed.pipelining import schedules as S

    log: list = []
    names: dict = {}
    inner: dict = {}

    def batch(ops, desc=None):
        t, cpu, ru = time.monotonic_ns(), time.thread_time_ns(), resource.getrusage(resource.RUSAGE_THREAD)
        works = inner["batch"](ops, desc)
        ru2 = resource.getrusage(resource.RUSAGE_THREAD)
        log.append(("post", desc, t, time.monotonic_ns(), len(ops), time.thread_time_ns() - cpu,
                    ru2.ru_nivcsw - ru.ru_nivcsw))
        for w in works:
            names[id(w)] = desc
        return works

    def wait(works):
        t = time.monotonic_ns()
        inner["wait"](works)
        desc = next((names.pop(id(w)) for w in works if id(w) in names), None)
        log.append(("wait", desc, t, time.monotonic_ns(), len(works), 0, 0))

    def wrap_step(cls):
        original = cls.step

        def step(self, *a, **k):
            if not inner:   # the first step: after the trainer's tap has put its wrappers there
                inner.update(batch=S._batch_p2p, wait=S._wait_batch_p2p)
                S._batch_p2p, S._wait_batch_p2p = batch, wait
            t = time.monotonic_ns()
            r = original(self, *a, **k)
            log.append(("step", None, t, time.monotonic_ns(), 0, 0, 0))
            return r
        cls.step = step

    for cls in (S.PipelineScheduleSingle, S.PipelineScheduleMulti):
        wrap_step(cls)

    from torch.distributed.pipelining import stage as G

    def wrap_action(name, kind, what="action"):
        original = getattr(G._PipelineStageBase, name)

        def action(self, *a, **k):
            t, cpu = time.monotonic_ns(), time.thread_time_ns()
            r = original(self, *a, **k)
            log.append((what, kind, t, time.monotonic_ns(), 1, time.thread_time_ns() - cpu, 0))
            return r
        setattr(G._PipelineStageBase, name, action)

    for name, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B"),
                       ("backward_weight_one_chunk", "W")):
        wrap_action(name, kind)
    for name, kind in (("forward_maybe_with_nosync", "F"), ("backward_maybe_with_nosync", "B")):
        wrap_action(name, kind, "core")

    def dump():
        with open(os.path.join(out, f"p2p-rank-{os.environ['RANK']}.json"), "w") as f:
            json.dump(log, f)
    atexit.register(dump)


def _steps(log: list) -> list:
    """[(start, end, [events])] per step."""
    out, cur = [], []
    for e in log:
        if e[0] == "step":
            out.append((e[2], e[3], cur))
            cur = []
        else:
            cur.append(e)
    return out


def analyse(out: str, skip: int) -> dict:
    logs = {}
    for r in (0, 1):
        with open(os.path.join(out, f"p2p-rank-{r}.json")) as f:
            logs[r] = json.load(f)
    steps = {r: _steps(logs[r])[skip:] for r in (0, 1)}
    res: dict = {"ranks": {}}
    excess = {}
    for r in (0, 1):
        peer_posts = sorted(e[3] for e in logs[1 - r] if e[0] == "post" and e[4] > 0)
        posts = slow = late = waits = 0
        slow_cpu, slow_ivcsw, per_step = [], [], []
        for _, _, events in steps[r]:
            x = 0.0
            for kind, _desc, t0, t1, n, cpu, ivcsw in events:
                if not n or kind in ("action", "core"):
                    continue
                wall = (t1 - t0) / 1e6
                if kind == "post":
                    posts += 1
                    if wall > 1:
                        slow += 1
                        slow_cpu.append(cpu / 1e6)
                        slow_ivcsw.append(ivcsw)
                    x += max(0.0, wall - 1.5)
                else:
                    waits += 1
                    i = bisect.bisect_right(peer_posts, t1) - 1
                    ready = max(t0, peer_posts[i]) if i >= 0 else t0
                    after = (t1 - ready) / 1e6
                    late += after > 1
                    x += max(0.0, after - 1.5)
            per_step.append(x)
        excess[r] = per_step
        res["ranks"][r] = {"posts": posts, "slow_posts": slow, "waits": waits, "late": late,
                           "slow_post_cpu_ms": st.median(slow_cpu) if slow_cpu else None,
                           "slow_post_switches": st.median(slow_ivcsw) if slow_ivcsw else None}
    for r in (0, 1):
        parts = {"actions": [], "action_cpu": [], "core": [], "posts": [], "waits": [], "rest": [], "n_actions": []}
        for t0, t1, events in steps[r]:
            wall = {k: sum((e[3] - e[2]) / 1e6 for e in events if e[0] == k)
                    for k in ("action", "core", "post", "wait")}
            for part, k in (("actions", "action"), ("core", "core"), ("posts", "post"), ("waits", "wait")):
                parts[part].append(wall[k])
            parts["action_cpu"].append(sum(e[5] / 1e6 for e in events if e[0] == "action"))
            parts["rest"].append((t1 - t0) / 1e6 - wall["action"] - wall["post"] - wall["wait"])
            parts["n_actions"].append(sum(e[0] == "action" for e in events))
        res["ranks"][r]["schedule_ms"] = {k: st.median(v) for k, v in parts.items() if v}
        # the actions' wall time by kind: forward F, backward B (the zero-bubble schedule's input gradients), its
        # weight gradients W; and per step the backward (B + W) over the forward, where the step has a forward
        kinds = {k: [sum((e[3] - e[2]) / 1e6 for e in events if e[0] == "action" and e[1] == k)
                     for _, _, events in steps[r]] for k in "FBW"}
        ratios = [(b + w) / f for f, b, w in zip(kinds["F"], kinds["B"], kinds["W"]) if f > 0]
        res["ranks"][r]["by_kind_ms"] = {k: st.median(v) for k, v in kinds.items() if v}
        res["ranks"][r]["backward_per_forward"] = st.median(ratios) if ratios else None
    n = min(len(steps[0]), len(steps[1]))
    walls = [(steps[0][i][1] - steps[0][i][0]) / 1e6 for i in range(n)]
    clean = [w for i, w in enumerate(walls) if excess[0][i] + excess[1][i] == 0]
    res.update(steps=n, step_ms=st.median(walls) if walls else None, clean_steps=len(clean),
               clean_step_ms=st.median(clean) if clean else None)
    return res


def report(res: dict) -> str:
    lines = []
    for r, v in res["ranks"].items():
        cpu = f", median {v['slow_post_cpu_ms']:.2f} ms CPU and {v['slow_post_switches']:g} involuntary switches " \
              "each" if v["slow_posts"] else ""
        lines.append(f"rank {r}: {v['posts']} posts, {v['slow_posts']} over 1 ms{cpu}; {v['waits']} waits, "
                     f"{v['late']} over 1 ms late")
        if v.get("schedule_ms"):
            b = v["schedule_ms"]
            lines.append(f"rank {r}, schedule.step, medians a step: {b['n_actions']:g} actions {b['actions']:.1f} ms "
                         f"({b['action_cpu']:.1f} ms CPU; the stage's forward/backward calls in them "
                         f"{b['core']:.1f} ms), posts {b['posts']:.1f}, waits {b['waits']:.1f}, "
                         f"the rest {b['rest']:.1f} ms")
        if v.get("backward_per_forward") is not None:
            k = v["by_kind_ms"]
            lines.append(f"rank {r}, actions by kind, medians a step: forward {k['F']:.1f} ms, backward {k['B']:.1f} ms, "
                         f"weight gradients {k['W']:.1f} ms; backward (with its weight gradients) over forward "
                         f"{v['backward_per_forward']:.3f} (median of the steps')")
    clean = f"{res['clean_step_ms']:.1f} ms" if res["clean_step_ms"] is not None else "-"
    lines.append(f"{res['steps']} steps: median {res['step_ms']:.1f} ms; {res['clean_steps']} clean (nothing over "
                 f"1.5 ms late on either rank): median {clean}")
    return "\n".join(lines)


def main() -> int:
    if os.environ.get(ENV) and "RANK" in os.environ:            # a rank spawned below
        sys.path.insert(0, ROOT)
        from torch.distributed import pipelining  # noqa: F401,PLC0415 - the module the wrappers patch

        _install(os.environ[ENV])
        from instrumented_trainer.cli import main as trainer_main  # noqa: PLC0415
        return trainer_main(sys.argv[1:])
    argv = sys.argv[1:]
    ours, trainer = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="run directory (the trainer's --out; the logs go there too)")
    ap.add_argument("--skip", type=int, default=4, help="first steps left out (warm-up, the profiler's window)")
    args = ap.parse_args(ours)
    sys.path.insert(0, ROOT)
    from instrumented_trainer.cli import build_parser, job_from_args  # noqa: PLC0415
    from instrumented_trainer.launch import spawn  # noqa: PLC0415

    trainer = trainer + ["--out", args.out]
    parsed = build_parser().parse_args(trainer)
    world = parsed.nproc or 1
    if world != 2:
        ap.error("a 2-rank pipeline job (--nproc 2 --pipeline-model-parallel-size 2): the other rank is the peer")
    os.makedirs(args.out, exist_ok=True)
    command = job_from_args(parsed, world, ["python", "-m", "instrumented_trainer", *trainer]).command
    os.environ[ENV] = os.path.abspath(args.out)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    code = spawn(world, trainer, shlex.join(command), module="benchmarks.p2p_timeline")
    if code:
        return code
    res = analyse(args.out, args.skip)
    with open(os.path.join(args.out, "p2p_timeline.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
