"""Temporal breakdown and overlap on traces whose answers are worked out by hand."""
import pytest

from diag.analysis import analyse_rank
from diag.trace import load_rank
from kineto import TraceBuilder

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def gpu_trace(tmp_path):
    """Three steps; the last one's kernel is outside the window (HTA convention).

    step 1: compute [10,40), comm [30,60), memcpy [55,70)
    step 2: compute [110,150) and [120,130) on another stream, comm [140,170)
    step 3: compute [210,250), launched in the last step -> left out
    span [10,170) = 160 us; compute 30+40 = 70; comm union 60, under compute 20 -> exposed 40;
    memory not under compute/comm: [60,70) = 10; busy [10,70)+[110,170) = 120 -> idle 40.
    """
    b = TraceBuilder()
    b.step(1, 0, 100).step(2, 100, 100).step(3, 200, 100)
    b.kernel("gemm_kernel", 10, 30).kernel(NCCL, 30, 30, stream=20)
    b.kernel("Memcpy HtoD (Pageable -> Device)", 55, 15, stream=9, cat="gpu_memcpy")
    b.kernel("gemm_kernel", 110, 40).kernel("elementwise_kernel", 120, 10, stream=8)
    b.kernel(NCCL, 140, 30, stream=20)
    b.kernel("gemm_kernel", 210, 40)
    return b.write(str(tmp_path / "rank0.json"))


def test_gpu_breakdown_by_hand(tmp_path):
    r = analyse_rank(load_rank(gpu_trace(tmp_path)))
    b, o = r.breakdown, r.overlap
    us = 1e-6
    assert b.timeline == "gpu"
    assert b.span_s == pytest.approx(160 * us)
    assert b.compute_s == pytest.approx(70 * us)
    assert b.comm_s == pytest.approx(40 * us)
    assert b.memory_s == pytest.approx(10 * us)
    assert b.idle_s == pytest.approx(40 * us)
    assert b.other_s == pytest.approx(0)
    assert o.comm_s == pytest.approx(60 * us)
    assert o.ratio == pytest.approx(1 / 3)
    assert o.exposed_s == pytest.approx(40 * us)
    assert o.exposed_per_step_s == pytest.approx(20 * us)
    assert [s.number for s in r.steps] == [1, 2, 3]
    assert [s.in_window for s in r.steps] == [True, True, False]
    assert [s.exposed_comm_s for s in r.steps[:2]] == pytest.approx([20 * us, 20 * us])
    assert r.step_time_s == pytest.approx(100 * us)
    assert r.excluded_events == 1
    top = {k.name: k for k in r.top_kernels}
    assert top["gemm_kernel"].count == 2 and top["gemm_kernel"].total_s == pytest.approx(70 * us)


def test_single_step_uses_whole_trace(tmp_path):
    b = TraceBuilder().step(1, 0, 100)
    b.kernel("gemm_kernel", 10, 30).kernel("gemm_kernel", 300, 10, launch_us=250)
    r = analyse_rank(load_rank(b.write(str(tmp_path / "t.json"))))
    assert r.breakdown.span_s == pytest.approx(300e-6)
    assert r.breakdown.compute_s == pytest.approx(40e-6)
    assert r.overlap.ratio is None           # no communication at all: unknown, not 0


def test_host_timeline_gloo_by_hand(tmp_path):
    """CPU-only: gloo:* on a worker thread is communication; ops nested in c10d:: are not compute.

    main thread: mm [0,300), c10d::allreduce_ [300,320) with aten::empty inside, mm [320,600)
    gloo thread: gloo:all_reduce [310,700)
    compute = 580; comm = [300,700) = 400; under compute [320,600) = 280; exposed 120; span 700.
    """
    b = TraceBuilder(backend="gloo").step(1, 0, 1000)
    b.cpu_op("aten::mm", 0, 300).cpu_op("c10d::allreduce_", 300, 20).cpu_op("aten::empty", 305, 1)
    b.cpu_op("aten::mm", 320, 280)
    b.cpu_op("gloo:all_reduce", 310, 390, tid=2, cat="user_annotation")
    r = analyse_rank(load_rank(b.write(str(tmp_path / "cpu.json"))))
    bd = r.breakdown
    assert bd.timeline == "host"
    assert bd.span_s == pytest.approx(700e-6)
    assert bd.compute_s == pytest.approx(580e-6)
    assert bd.comm_s == pytest.approx(120e-6)
    assert bd.idle_s == pytest.approx(0)
    assert r.overlap.ratio == pytest.approx(280 / 400)
