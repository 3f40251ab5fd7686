"""A last ProfilerStep in which the host did nothing (a stub the profiler opened as it stopped) is
no step: the run's step time leaves it out, and says so. A last step with work stays in."""
import gzip
import json
import os

import pytest

from conftest import DATA
from diag.analysis.rankpass import summarize
from diag.trace import load_rank
from kineto import TraceBuilder

MI250 = os.path.join(DATA, "mi250_rocm_single", "mi250_minitoy_train_ROCm6_2_kineto.json.gz")


def test_rocm_trace_ending_in_a_stub_step_times_its_one_real_step():
    """The ROCm trace's ProfilerStep#2 lasts 49 us and holds no host event; the median of the two
    read 4.7 ms, half of step #1, and the idle rule priced 4.7 -> 0.3 ms from it."""
    with gzip.open(MI250) as f:
        events = json.load(f)["traceEvents"]
    steps = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep")), key=lambda e: e["ts"])
    assert [e["name"] for e in steps] == ["ProfilerStep#1", "ProfilerStep#2"]
    r = summarize(load_rank(MI250)).result
    assert r.step_time_s == pytest.approx(steps[0]["dur"] * 1e-6, rel=1e-9)
    assert [s.number for s in r.steps] == [1, 2]            # still listed: the window's convention needs it
    assert any("ProfilerStep#2 (0.0491 ms) holds no operator" in n for n in r.notes)


def _three_steps(tmp_path, last_op: bool) -> str:
    b = TraceBuilder()
    for n, (ts, dur) in enumerate([(0, 100), (100, 300), (400, 50)], start=1):
        b.step(n, ts, dur)
    b.cpu_op("aten::mm", 10, 80).cpu_op("aten::mm", 110, 250)
    if last_op:
        b.cpu_op("aten::mm", 410, 30)
    return b.write(str(tmp_path / "rank0.json"))


@pytest.mark.parametrize("last_op, step_us, stub", [(True, 100, False), (False, 200, True)])
def test_only_an_empty_last_step_is_left_out(tmp_path, last_op, step_us, stub):
    """Steps of 100, 300 and 50 us: with an operator in the last, the median of the three (100 us);
    without, the median of the first two (200 us)."""
    r = summarize(load_rank(_three_steps(tmp_path, last_op))).result
    assert r.step_time_s == pytest.approx(step_us * 1e-6)
    assert any("holds no operator" in n for n in r.notes) is stub
