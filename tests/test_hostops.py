"""Host operators' counts and fixed costs (analysis.hostops) on hand-made traces, worked by hand."""
import numpy as np
import pytest

from diag.analysis.hostops import nesting_parent
from diag.analysis.rankpass import summarize
from diag.trace import load_job

from kineto import TraceBuilder

US = 1e-6


def test_nesting_parent_is_the_innermost_enclosing_call():
    # 0 [0,100) holds 1 [10,50) holding 2 [20,30); 3 [50,60) starts as 1 ends; 4 [0,5) shares 0's start
    start = np.array([0, 10, 20, 50, 0, 200])
    end = np.array([100, 50, 30, 60, 5, 210])
    assert nesting_parent(start, end).tolist() == [-1, 0, 1, 0, 0, -1]


def _host_trace(tmp_path, dtensor: bool = False):
    """Two steps of 1000 us; the window keeps the first. In it (us):
    evaluate_function [100,400) > MmBackward0 [110,390) > aten::mm [120,320) and
    aten::t [330,340) > aten::transpose [331,337) > aten::as_strided [332,335);
    aten::view [450,452); Optimizer.step [600,900) > aten::add_ [610,650), aten::mul_ [660,700);
    c10d::allreduce_ [950,990) (communication: not counted)."""
    b = TraceBuilder(backend="gloo").step(1, 0, 1000).step(2, 1000, 1000)
    b.cpu_op("autograd::engine::evaluate_function: MmBackward0", 100, 300).cpu_op("MmBackward0", 110, 280)
    b.cpu_op("aten::mm", 120, 200).cpu_op("aten::t", 330, 10).cpu_op("aten::transpose", 331, 6)
    b.cpu_op("aten::as_strided", 332, 3).cpu_op("aten::view", 450, 2)
    b.cpu_op("Optimizer.step#AdamW.step", 600, 300, cat="user_annotation")
    b.cpu_op("aten::add_", 610, 40).cpu_op("aten::mul_", 660, 40).cpu_op("c10d::allreduce_", 950, 40)
    if dtensor:      # DTensor's mark, a wrapper of 10 us, and a dispatch mode's 30 us self around an 8 us ATen call
        b.cpu_op("Redistribute", 500, 5, cat="user_annotation").cpu_op("_FromTorchTensor", 460, 10)
        b.cpu_op("PythonDispatchMode", 510, 38).cpu_op("aten::addmm", 520, 8)
    b.cpu_op("aten::mm", 1001, 499)
    b.write(str(tmp_path / "rank0.json"))
    job = load_job(str(tmp_path))
    return summarize(job.ranks[0]).result.host_ops


def test_counts_and_fixed_cost_of_a_host_step(tmp_path):
    """Self times (us): evaluate 300-280 = 20, MmBackward0 280-200-10 = 70, mm 200, t 10-6 = 4,
    transpose 6-3 = 3, as_strided 3, view 2, add_ 40, mul_ 40. ATen self times 2,3,3,4,40,40,200:
    median 4 us. Outside the optimizer: 5 ATen calls, non-ATen self 20 + 70 = 90 us.
    Fixed = 5 x 4 + 90 = 110 us per step."""
    h = _host_trace(tmp_path)
    assert (h.ops_per_step, h.optimizer_ops_per_step, h.aten_ops_per_step) == (9, 2, 5)
    assert h.aten_op_s == pytest.approx(4 * US)
    assert h.framework_per_step_s == pytest.approx(90 * US)
    assert h.fixed_per_step_s == pytest.approx(110 * US)
    assert h.dtensor_per_step_s == 0.0


def test_dtensor_dispatch_counted_only_with_its_marks(tmp_path):
    """With DTensor's Redistribute mark, its wrapper _FromTorchTensor's 10 us is DTensor's dispatch;
    PythonDispatchMode's self time 38 - 8 = 30 us is a dispatch mode's (a TorchDispatchMode's call
    around the op: not DTensor's, paid at any TP); both framework time. addmm is a sixth ATen call
    outside the optimizer (self 8 us): ATen self times 2,3,3,4,8,40,40,200, median (4 + 8) / 2 = 6 us."""
    h = _host_trace(tmp_path, dtensor=True)
    assert h.dtensor_per_step_s == pytest.approx(10 * US)
    assert h.dispatch_mode_per_step_s == pytest.approx(30 * US)
    assert h.framework_per_step_s == pytest.approx(130 * US)
    assert h.aten_ops_per_step == 6 and h.aten_op_s == pytest.approx(6 * US)
    assert h.fixed_per_step_s == pytest.approx(6 * 6 * US + 130 * US)


def test_a_skewed_wrapper_counts_all_its_calls_time(tmp_path):
    """Three `Redistribute` calls of 10, 10 and 100 us and two `detach` of 4 and 6 us (DTensor's
    wrappers are bimodal: a cached placement is cheap, a new one is not): their self times added
    up, 120 + 10 = 130 us, not 3 x their median 10 + 2 x 5 = 40 us; one `aten::view` of 2 us."""
    b = TraceBuilder(backend="gloo").step(1, 0, 1000).step(2, 1000, 1000)
    b.cpu_op("Redistribute", 100, 10).cpu_op("Redistribute", 200, 10).cpu_op("Redistribute", 300, 100)
    b.cpu_op("detach", 420, 4).cpu_op("detach", 440, 6).cpu_op("aten::view", 500, 2)
    b.cpu_op("aten::mm", 1001, 499).write(str(tmp_path / "rank0.json"))
    h = summarize(load_job(str(tmp_path)).ranks[0]).result.host_ops
    assert h.framework_per_step_s == pytest.approx(130 * US)
    assert h.fixed_per_step_s == pytest.approx(132 * US)


def _fsdp_trace(tmp_path, marks: bool = True):
    """FSDP2 on a host timeline, two steps of 1000 us, the first in the window (us):
    FSDP::pre_forward (layers.0) [100,300) > FSDP::all_gather (layers.0) [110,290) >
    fsdp::all_gather_copy_in [115,135) > aten::cat [116,134), and c10d::_allgather_base_ [140,220)
    (a collective: priced as traffic, left out); FSDP::post_backward_reduce (layers.0) [500,560) >
    c10d::_reduce_scatter_base_ [510,540); aten::mm [320,420) (the module's compute, outside);
    Optimizer.step [600,900) > _ToTorchTensor [610,650) > aten::add_ [620,630) (DTensor's wrapper) and
    PythonDispatchMode [700,760) > aten::add_ [710,720) (a dispatch mode's). Without marks, the FSDP:: spans are left out
    and the copy is a plain `copy_in` (the same operators, as another sharding framework shows them)."""
    b = TraceBuilder(backend="gloo").step(1, 0, 1000).step(2, 1000, 1000)
    if marks:
        b.cpu_op("FSDP::pre_forward (layers.0)", 100, 200, cat="user_annotation")
        b.cpu_op("FSDP::all_gather (layers.0)", 110, 180, cat="user_annotation")
        b.cpu_op("FSDP::post_backward_reduce (layers.0)", 500, 60, cat="user_annotation")
    b.cpu_op("fsdp::all_gather_copy_in" if marks else "copy_in", 115, 20).cpu_op("aten::cat", 116, 18)
    b.cpu_op("c10d::_allgather_base_", 140, 80).cpu_op("aten::mm", 320, 100)
    b.cpu_op("c10d::_reduce_scatter_base_", 510, 30)
    b.cpu_op("Optimizer.step#AdamW.step", 600, 300, cat="user_annotation")
    b.cpu_op("_ToTorchTensor", 610, 40).cpu_op("aten::add_", 620, 10)
    b.cpu_op("PythonDispatchMode", 700, 60).cpu_op("aten::add_", 710, 10)
    b.cpu_op("aten::mm", 1001, 499)
    b.write(str(tmp_path / "rank0.json"))
    return summarize(load_job(str(tmp_path)).ranks[0]).result.host_ops


def test_fsdp_own_time_is_its_spans_less_the_collectives_in_them(tmp_path):
    """FSDP's spans cover [100,300) and [500,560): 260 us; the collectives inside them 80 + 30 us:
    FSDP's own 150 us. The optimizer's DTensor dispatch: _ToTorchTensor's self time 30 us (the
    dispatch mode's 50 us is not DTensor's: in the traces at hand it was the diag trainer's comm
    tap, there in a replicated run's optimizer too). Outside FSDP's spans and the optimizer only aten::mm is left: one
    ATen call (the fixed cost counts none of fsdp::all_gather_copy_in and aten::cat)."""
    h = _fsdp_trace(tmp_path)
    assert h.fsdp_per_step_s == pytest.approx(150 * US)
    assert h.fsdp_optimizer_dispatch_per_step_s == pytest.approx(30 * US)
    assert h.aten_ops_per_step == 1 and h.framework_per_step_s == 0.0


def test_fsdp_time_unknown_without_its_marks(tmp_path):
    """The same operators without FSDP2's marks: FSDP's time is unknown (None), not zero, and its
    copies count in the fixed cost like any operator: ATen calls cat and mm, framework copy_in's
    self time 20 - 18 = 2 us."""
    h = _fsdp_trace(tmp_path, marks=False)
    assert h.fsdp_per_step_s is None and h.fsdp_optimizer_dispatch_per_step_s is None
    assert h.aten_ops_per_step == 2 and h.framework_per_step_s == pytest.approx(2 * US)


def _fsdp_wait_trace(tmp_path):
    """FSDP2 on a host timeline as gloo runs it (us; two steps of 1000, the first in the window; main
    thread 100, gloo's worker thread 200). An autograd node evaluate_function [100,500) whose hook
    runs FSDP::pre_backward (layers.0) [120,480) > FSDP::all_gather (layers.0) [130,470), in which:
    fsdp::all_gather_copy_in [140,160) > aten::cat [141,159); c10d::_allgather_base_ [170,190) posts
    the all-gather, which gloo runs on its worker, gloo:all_gather [185,450), the main thread waiting
    for it (Work.wait records no operator) but for an operator of FSDP's own that runs meanwhile,
    aten::copy_ [300,310); fsdp::split_with_sizes_copy [455,465) >
    aten::split_with_sizes_copy [456,464). Then the node's AddBackward0 [485,495) and aten::mm [520,620).
    FSDP::post_backward_reduce (layers.0) [700,800) holds c10d::_reduce_scatter_base_ [705,745) > a
    dispatch mode's PythonDispatchMode [710,740) > c10d::_reduce_scatter_base_ [720,730) (the comm tap
    around the collective, inside the dispatcher's call of it), and PythonDispatchMode [750,770) >
    aten::div_ [752,758] (the tap around FSDP's own operator)."""
    b = TraceBuilder(backend="gloo").step(1, 0, 1000).step(2, 1000, 1000)
    b.cpu_op("autograd::engine::evaluate_function: AddBackward0", 100, 400)
    b.cpu_op("FSDP::pre_backward (layers.0)", 120, 360, cat="user_annotation")
    b.cpu_op("FSDP::all_gather (layers.0)", 130, 340, cat="user_annotation")
    b.cpu_op("fsdp::all_gather_copy_in", 140, 20).cpu_op("aten::cat", 141, 18)
    b.cpu_op("c10d::_allgather_base_", 170, 20).cpu_op("gloo:all_gather", 185, 265, tid=200, cat="user_annotation")
    b.cpu_op("aten::copy_", 300, 10)
    b.cpu_op("fsdp::split_with_sizes_copy", 455, 10).cpu_op("aten::split_with_sizes_copy", 456, 8)
    b.cpu_op("AddBackward0", 485, 10).cpu_op("aten::mm", 520, 100)
    b.cpu_op("FSDP::post_backward_reduce (layers.0)", 700, 100, cat="user_annotation")
    b.cpu_op("c10d::_reduce_scatter_base_", 705, 40).cpu_op("PythonDispatchMode", 710, 30)
    b.cpu_op("c10d::_reduce_scatter_base_", 720, 10)
    b.cpu_op("PythonDispatchMode", 750, 20).cpu_op("aten::div_", 752, 6)
    b.cpu_op("aten::mm", 1001, 499)
    b.write(str(tmp_path / "rank0.json"))
    return summarize(load_job(str(tmp_path)).ranks[0]).result


def test_fsdp_waits_for_gloos_worker_are_communication_not_its_own_time(tmp_path):
    """FSDP's spans cover [120,480) and [700,800): 460 us. Blocked in communication: its collectives'
    calls [170,190) and [705,745), and the wait for the all-gather on the worker thread, [185,450) less
    the copy_ FSDP runs meanwhile [300,310): [170,300) + [310,450) + [705,745) = 310 us. Its own
    time: 460 - 310 = 150 us ([120,170) + [300,310) + [450,480) + [700,705) + [745,800)); until
    2026-11-28 the wait was in it too (460 - 60 = 400). The dispatch mode's self time inside FSDP's
    spans: 14 us of its own (750-770 less div_'s 6) and 20 us held in the reduce-scatter's call
    (710-740 less the inner call's 10)."""
    h = _fsdp_wait_trace(tmp_path).host_ops
    assert h.fsdp_per_step_s == pytest.approx(150 * US)
    assert h.fsdp_dispatch_mode_per_step_s == pytest.approx(14 * US)
    assert h.fsdp_comm_dispatch_mode_per_step_s == pytest.approx(20 * US)
    assert h.dispatch_mode_per_step_s == 0.0


def test_fsdp_spans_in_an_autograd_node_are_not_its_self_time(tmp_path):
    """The node evaluate_function [100,500): 400 us less its nested calls (copy_in 20, the all-gather's
    call 20, copy_ 10, the copy-out 10, AddBackward0 10) is 330 us, but FSDP's span [120,480) covers
    360 us of it, 60 of which are those nested calls: its self time is 330 - 300 = 30 us ([100,120) +
    [480,485) + [495,500)), not 330 (which counted FSDP's hook, wait included, in the fixed cost a
    replicated run pays too). Framework: 30 + AddBackward0's 10 = 40 us; ATen outside FSDP's spans: aten::mm alone."""
    h = _fsdp_wait_trace(tmp_path).host_ops
    assert h.framework_per_step_s == pytest.approx(40 * US)
    assert h.aten_ops_per_step == 1


def test_a_wait_inside_fsdps_span_is_not_compute(tmp_path):
    """The breakdown of the same step: operators cover [100,500) + [520,620) + [710,740) + [750,770);
    less the collectives' calls [170,190) and [705,745) and the waits [190,300) and [310,450) left:
    compute [100,170) + [300,310) + [450,500) + [520,620) + [750,770) = 250 us (until 2026-11-28: 500,
    the wait counted as the autograd node's compute). Communication [170,450) + [705,745) = 320 us, of
    which 10 under compute (the copy_): 310 exposed."""
    b = _fsdp_wait_trace(tmp_path).breakdown
    assert b.compute_s == pytest.approx(250 * US)
    assert b.comm_s == pytest.approx(310 * US)
