"""The backward's compute and its linear layers' share (analysis.backward), the zero-bubble
schedule's weight pass priced on it (advise.schedule), worked by hand and read against the raw
events of real traces."""
import gzip
import json

import numpy as np
import pytest

from diag.advise import Config, Links, Workload
from diag.advise.model import step_time
from diag.analysis.backward import WEIGHT_GEMM_NODES, WEIGHT_ONLY_NODES
from diag.analysis.rankpass import summarize
from diag.trace import load_job

from kineto import TraceBuilder

US, MS = 1e-6, 1e-3
NODE = "autograd::engine::evaluate_function: "


def _result(tmp_path, b: TraceBuilder):
    b.write(str(tmp_path / "rank0.json"))
    return summarize(load_job(str(tmp_path)).ranks[0]).result


def test_host_backward_and_its_weight_gradients(tmp_path):
    """Two steps of 1000 us (the window keeps the first). In it: AddmmBackward0 [100,300) holding
    two mm of 80 us, ScaledDotProduct...Backward0 [300,400), MmBackward0 [400,440), a forward mm
    [500,600) outside every node, a gloo all-reduce [600,650) inside NativeLayerNormBackward0
    [600,700) (communication: not compute), AccumulateGrad [700,730) and EmbeddingBackward0
    [730,800). Backward compute 200 + 100 + 40 + 50 + 30 + 70 = 490 us; of it the linear layers'
    240 us, half of it weight gradients, and 100 us of weight gradients only: (120 + 100) / 490."""
    b = TraceBuilder(backend="gloo").step(1, 0, 1000).step(2, 1000, 1000)
    b.cpu_op(NODE + "AddmmBackward0", 100, 200).cpu_op("aten::mm", 110, 80).cpu_op("aten::mm", 200, 80)
    b.cpu_op(NODE + "ScaledDotProductFlashAttentionForCpuBackward0", 300, 100)
    b.cpu_op(NODE + "MmBackward0", 400, 40).cpu_op("aten::mm", 500, 100)
    b.cpu_op(NODE + "NativeLayerNormBackward0", 600, 100).cpu_op("c10d::allreduce_", 600, 50)
    b.cpu_op(NODE + "torch::autograd::AccumulateGrad", 700, 30).cpu_op(NODE + "EmbeddingBackward0", 730, 70)
    b.cpu_op(NODE + "AddmmBackward0", 1100, 300)                    # the second step: out of the window
    split = _result(tmp_path, b).backward
    assert split.backward_s == pytest.approx(490 * US)
    assert split.weight_gemm_s == pytest.approx(240 * US)
    assert split.weight_only_s == pytest.approx(100 * US)
    assert split.weight_share == pytest.approx(220 / 490)


def test_gpu_backward_is_the_kernels_launched_inside_its_nodes(tmp_path):
    """On a GPU: the compute kernels launched from inside a node, wherever they run. AddmmBackward0
    [100,200) launches two 300 us GEMMs (at 150 and 180: kernels [400,700) and [700,1000)), the
    flash-attention backward node [200,260) one 400 us kernel [1000,1400); a forward GEMM launched
    at 50 [300,400) is outside. Backward 1000 us, linear 600: share 0.3."""
    b = TraceBuilder().step(1, 0, 2000).step(2, 2000, 100)
    b.cpu_op(NODE + "AddmmBackward0", 100, 100).cpu_op(NODE + "FlashAttnFuncBackward", 200, 60)
    b.kernel("sm90_xmma_gemm_fwd", 300, 100, launch_us=50)
    b.kernel("sm90_xmma_gemm_dgrad", 400, 300, launch_us=150).kernel("sm90_xmma_gemm_wgrad", 700, 300, launch_us=180)
    b.kernel("flash_bwd_kernel", 1000, 400, launch_us=230)
    split = _result(tmp_path, b).backward
    assert (split.backward_s, split.weight_gemm_s) == (pytest.approx(1000 * US), pytest.approx(600 * US))
    assert split.weight_share == pytest.approx(0.3)


def test_no_autograd_nodes_is_unknown_not_zero(tmp_path):
    b = TraceBuilder().step(1, 0, 1000).step(2, 1000, 100).kernel("gemm", 100, 500, launch_us=50)
    assert _result(tmp_path, b).backward is None


def test_weight_nodes_of_torch_megatron_and_te():
    for node in ("AddmmBackward0", "MmBackward0", "LinearWithGradAccumulationAndAsyncCommunicationBackward",
                 "_LinearBackward", "_LayerNormLinearBackward", "_LayerNormMLPBackward", "ConvolutionBackward0"):
        assert WEIGHT_GEMM_NODES.match(NODE + node) and not WEIGHT_ONLY_NODES.match(NODE + node), node
    for node in ("EmbeddingBackward0", "torch::autograd::AccumulateGrad"):
        assert WEIGHT_ONLY_NODES.match(NODE + node) and not WEIGHT_GEMM_NODES.match(NODE + node), node
    for node in ("BmmBackward0", "ScaledDotProductFlashAttentionForCpuBackward0", "NativeLayerNormBackward0",
                 "CudnnBatchNormBackward0"):
        assert not (WEIGHT_GEMM_NODES.match(NODE + node) or WEIGHT_ONLY_NODES.match(NODE + node)), node


def _window(path: str) -> tuple[list, list, float, float]:
    """A raw trace's complete events, its host ProfilerSteps and the analysed window [lo, hi): the one
    step where there is one, else every step but the last."""
    events = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep") and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])
    lo, hi = (steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]) if len(steps) == 1 else (steps[0]["ts"], steps[-1]["ts"])
    return events, steps, lo, hi


def _split(timed: list, steps: list) -> tuple[float, float, float]:
    """(event, its autograd node's name or None) pairs -> seconds per step of the union of the events'
    intervals: under any node, under the layers with a weight, under the weight-only nodes."""
    def union(evs):
        total, end = 0.0, -np.inf
        for e in sorted(evs, key=lambda e: e["ts"]):
            total += max(0.0, e["ts"] + e["dur"] - max(e["ts"], end))
            end = max(end, e["ts"] + e["dur"])
        return total * US / max(len(steps) - 1, 1)
    return (union([e for e, n in timed if n]), union([e for e, n in timed if n and WEIGHT_GEMM_NODES.match(n)]),
            union([e for e, n in timed if n and WEIGHT_ONLY_NODES.match(n)]))


def _matches(split, truth: tuple, rel: float, only_abs: float = 0.0) -> None:
    """The rank pass's BackwardSplit against the truth from the raw events (_split); only_abs: an
    absolute tolerance for the weight-only part, which can be a few kernels."""
    assert split.backward_s == pytest.approx(truth[0], rel=rel)
    assert split.weight_gemm_s == pytest.approx(truth[1], rel=rel)
    assert split.weight_only_s == pytest.approx(truth[2], rel=rel, abs=only_abs)
    assert 0.2 < split.weight_share < 0.5


def _raw_host_split(path: str) -> tuple[float, float, float]:
    """Truth from the raw events of a CPU trace with no communication inside its nodes: the union of
    the autograd nodes' spans in the window: all, the layers with a weight and the weight-only nodes."""
    events, steps, lo, hi = _window(path)
    return _split([(e, e["name"]) for e in events if e["name"].startswith(NODE) and lo <= e["ts"] < hi], steps)


def test_real_cpu_trace_against_its_raw_events():
    path = "sample_traces/pp2_m2/rank-0.pt.trace.json.gz"
    truth = _raw_host_split(path)
    assert truth[2] > 0                              # the trace has weight-only nodes to count
    _matches(summarize(load_job(path).ranks[0]).result.backward, truth, rel=1e-6)


def test_zero_bubble_prices_the_measured_weight_share():
    """p = 2, m = 2, one layer a stage, forward f, backward 2f split into I = 2f(1 - s) and W = 2fs,
    no communication. Stage 1 runs F0 I0 F1 I1 W0 W1: F0 at f-2f, I0 to 2f + I, F1 to 3f + I, I1 to
    3f + 2I, then both W: 3f + 2I + 2W. Stage 0 runs F0 F1 I0 W0 I1 W1: I0 waits for stage 1's I0
    (2f + I), W0 to 2f + 2I + W, I1 waits for stage 1's I1 (3f + 2I; W <= f), W1 ends at 3f + 3I + W.
    s = 1/2: both 7f (test_model). s = 1/4 (I = 1.5f, W = 0.5f): stage 0 8f, stage 1 7f, the step 8f;
    1F1B's 9f does not depend on s."""
    f = 1 * MS
    for share, zb in ((0.5, 7 * f), (0.25, 8 * f)):
        w = Workload(num_layers=2, fwd_s_per_layer=f, weight_share=share)
        assert step_time(w, Config(pp=2, num_micro_batches=2), Links()) == pytest.approx(9 * f)
        assert step_time(w, Config(pp=2, num_micro_batches=2, schedule="zb1p"), Links()) == pytest.approx(zb)
    with pytest.raises(ValueError, match="weight_share"):
        Workload(num_layers=2, fwd_s_per_layer=f, weight_share=0.0)


def test_calibration_carries_the_measured_share_into_the_zero_bubble_lever():
    """A real PP 2 CPU run (TP 2 x PP 2 x DP 2, 8 ranks): the model's weight share is the ranks' mean, said in
    the calibration notes and in the zero-bubble recommendation's assumptions; a job without autograd nodes
    keeps half and says it is assumed."""
    from diag.advise.calibrate import calibrate
    from diag.advise.recommend import with_advice
    from diag.analysis import diagnose
    d = diagnose(load_job("sample_traces/tp2_pp2_dp2"))
    shares = [r.backward.weight_share for r in d.ranks]
    cal = calibrate(d)
    assert cal.workload.weight_share == pytest.approx(float(np.mean(shares)))
    assert any(a.startswith(f"weight gradients {np.mean(shares):.0%} of each layer's backward: half the compute in "
                            "its weighted layers' autograd nodes and all of its weight-only nodes'")
               for a in cal.assumptions)
    recs = {r.rule: r for r in with_advice(d).recommendations}
    assert f"weight gradients {np.mean(shares):.0%} of each layer's backward (model calibration)" \
        in recs["zero_bubble"].assumptions


def test_a_zero_bubble_run_is_read_less_its_split_backward(tmp_path):
    """A ZB1P job (PP 2, m = 4, 2 layers a stage, forward 1 ms) whose second stage runs torch's split backward
    14% dearer, as the model prices it (calibrate.SPLIT_BACKWARD_EXTRA), synthesised and read as a host
    timeline, where that extra is priced. Calibrated on it, stage 1's compute is read less the extra: the
    stages balanced (slowdowns 1 and 1, not 0.955 and 1.045: 3 units against 3 + 2 x 0.14), the forward
    1 ms, and the model's step the measured one, where it paid the extra twice before. A 1F1B job's stages
    are read as they are."""
    from diag.advise import simulate
    from diag.advise.calibrate import SPLIT_BACKWARD_EXTRA, calibrate
    from diag.advise.synth import write_job
    from diag.analysis import diagnose
    for schedule, extra in (("zb1p", SPLIT_BACKWARD_EXTRA), ("1f1b", 0.0)):
        w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, split_backward_extra=extra)
        c = Config(pp=2, num_micro_batches=4, schedule=schedule)
        out = tmp_path / schedule
        write_job(simulate(w, c, Links(), steps=4), str(out), c, w)
        d = diagnose(load_job(str(out)))
        for r in d.ranks:
            r.timeline = "host"
        cal = calibrate(d)
        assert (cal.config.schedule, cal.workload.split_backward_extra) == (schedule, SPLIT_BACKWARD_EXTRA)
        assert [cal.stage_slowdown[s] for s in (0, 1)] == pytest.approx([1.0, 1.0], rel=1e-9)
        assert cal.workload.fwd_s_per_layer == pytest.approx(1 * MS, rel=1e-9)
        assert cal.model_step_s == pytest.approx(cal.measured_step_s, rel=1e-9)


def test_a_job_without_autograd_nodes_assumes_half(tmp_path):
    from diag.advise.calibrate import calibrate
    from diag.advise import simulate
    from diag.advise.synth import write_job
    from diag.analysis import diagnose
    w, c = Workload(num_layers=4, fwd_s_per_layer=1 * MS, p2p_bytes=1.0), Config(pp=2, num_micro_batches=2)
    write_job(simulate(w, c, Links(pp=1e15), steps=4), str(tmp_path), c, w)
    d = diagnose(load_job(str(tmp_path)))
    assert all(r.backward is None for r in d.ranks)
    cal = calibrate(d)
    assert cal.workload.weight_share == 0.5
    assert any("weight gradients 50% of each layer's backward (assumed" in a for a in cal.assumptions)


def _raw_gpu_split(path: str) -> tuple[float, float, float]:
    """Truth from the raw events of a GPU trace: the compute kernels of the window (by their launch)
    whose launch (the runtime or driver call of the same correlation id) falls inside an autograd
    node's span on the launching thread; the union of their intervals, all, under the layers with a
    weight, under the weight-only nodes."""
    events, steps, lo, hi = _window(path)
    launch = {e["args"]["correlation"]: e for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    nodes: dict = {}
    for e in events:
        if e["name"].startswith(NODE) and e.get("cat") == "cpu_op":
            nodes.setdefault(e["tid"], []).append(e)

    def node_of(call):
        inside = [n for n in nodes.get(call["tid"], []) if n["ts"] <= call["ts"] <= n["ts"] + n["dur"]]
        return max(inside, key=lambda n: n["ts"])["name"] if inside else None
    kernels = []
    for k in events:
        call = launch.get(k.get("args", {}).get("correlation")) if k.get("cat") == "kernel" else None
        if call is not None and lo <= call["ts"] < hi and not k["name"].startswith(("nccl", "ncclDev")):
            kernels.append((k, node_of(call)))
    return _split(kernels, steps)


def test_real_gpu_trace_against_its_raw_events():
    """The H200 GPT sample (12 layers, bf16): the backward's kernels and their linear layers' part."""
    path = "sample_traces/h200_single/rank-0.pt.trace.json.gz"
    _matches(summarize(load_job(path).ranks[0]).result.backward, _raw_gpu_split(path), rel=1e-3, only_abs=1e-6)


def test_gpu_rows_launches_are_the_runtime_calls_of_their_correlation():
    """hostlink.launches, through the table's launch_index (sorted once per table): each GPU row's
    launch is the first runtime row of the same correlation id, found by brute force here on the
    H200 sample; (-1, -1) where none is. A second look-up gives the same."""
    from diag.analysis.hostlink import launches
    from diag.trace.kinds import Kind

    t = load_job("sample_traces/h200_single/rank-0.pt.trace.json.gz").ranks[0].events
    first: dict = {}
    for r in np.flatnonzero(t.kind == Kind.RUNTIME).tolist():
        if t.correlation[r] >= 0:
            first.setdefault(int(t.correlation[r]), r)
    rows = np.flatnonzero(t.gpu_mask())
    want = [(int(t.ts_ns[first[c]]), int(t.thread[first[c]])) if c in first else (-1, -1)
            for c in t.correlation[rows].tolist()]
    assert sum(w != (-1, -1) for w in want) > 1000
    for _ in range(2):
        ts, th = launches(t, rows)
        assert list(zip(ts.tolist(), th.tolist())) == want
