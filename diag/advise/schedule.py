"""What each rank issues in one training step, in program order.

The step-time model (model.py) needs, per rank, the sequence of work the rank runs: the
forward and backward passes of its micro-batches in the pipeline schedule's order, the TP
all-reduces inside each layer, the pipeline sends and receives around each pass, the DP
gradient buckets and the optimizer. This module writes that program as a list of
instructions per stream, and runs the programs of all ranks against each other (Engine):
compute takes its time; a collective starts when its whole group has arrived, and each
rank's op lasts from its own arrival to the end of the transfer; sends are eager, and a
receive lasts from when the rank is ready until the data is there.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional
from ..record import record

SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb1p")
WEIGHT_SHARE = 0.5      # zero-bubble: the weight-gradient pass's share of a layer's backward where the trace does
                        # not say (one GEMM of two; Workload.weight_share, from analysis.backward, where it does)
WHATS = ("compute", "send", "recv", "coll", "launch", "wait", "idle", "mark")
# schedules torch.distributed.pipelining runs on its multi-stage runtime (_PipelineScheduleRuntime), which
# posts each send and receive as an action of its own (SEND_F, RECV_F, SEND_B, RECV_B) between the compute
# actions: they pay StageCosts.post_s; 1F1B and GPipe (PipelineScheduleSingle) post theirs inside the loop
POSTED_SCHEDULES = ("interleaved", "zb1p")


@record(frozen=True)
class Instr:
    """One instruction of a rank's program on one stream ("main" or "dp")."""

    what: str                       # one of WHATS
    name: str = ""
    dur_s: float = 0.0              # compute / idle: its length; send / coll: the transfer time
    axis: Optional[str] = None      # tp | cp | pp | dp for communication
    op: Optional[str] = None        # all_reduce | send | recv
    nbytes: int = 0
    group: tuple = ()               # process-group member ranks
    key: tuple = ()                 # rendezvous / event key shared by the ranks involved

    def __post_init__(self) -> None:
        if self.what not in WHATS:
            raise ValueError(f"unknown instruction {self.what!r}")
        if self.dur_s < 0:
            raise ValueError(f"{self.name}: negative duration {self.dur_s}")


def interleaved_order(p: int, s: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """(pass, micro-batch, model chunk) in the order stage s of p runs them under Megatron-LM's
    interleaved 1F1B (`forward_backward_pipelining_with_interleaving`): micro-batches go through
    the v chunks in groups of p; (p-s-1)*2 + (v-1)*p warm-up forwards, then one forward and one
    backward alternately, then the remaining backwards. Forward k runs chunk (k // p) % v of
    micro-batch (k // (p v)) p + k % p; backward k the chunks in reverse."""
    if m % p:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({m}) to be a multiple of the stages ({p})")
    total = m * v
    warm = min((p - s - 1) * 2 + (v - 1) * p, total)

    def mb(k): return (k // (p * v)) * p + k % p
    def fwd(k): return ("F", mb(k), (k // p) % v)
    def bwd(k): return ("B", mb(k), v - 1 - (k // p) % v)
    order = [fwd(k) for k in range(warm)]
    for j in range(total - warm):
        order += [fwd(warm + j), bwd(j)]
    return order + [bwd(k) for k in range(total - warm, total)]


def zero_bubble_order(p: int, s: int, m: int) -> list[tuple[str, int]]:
    """(pass, micro-batch) in the order stage s of p runs them under the zero-bubble schedule of
    torch.distributed.pipelining's ScheduleInterleavedZeroBubble with one stage a rank (ZB1P, Qi
    et al. 2023), its backward split into input ("I") and weight ("W") gradients: min(p-s-1, m)
    warm-up forwards, then a forward and an input backward alternately, then the remaining input
    backwards; from the (s+1)-th input backward on, each is followed by the oldest weight backward
    not yet run, and the rest come last. The weight passes fill the waits 1F1B has."""
    warm = min(p - s - 1, m)
    order = [("F", i) for i in range(warm)]
    done = 0
    for k in range(m):
        if warm + k < m:
            order.append(("F", warm + k))
        order.append(("I", k))
        if k >= s:
            order.append(("W", done))
            done += 1
    return order + [("W", i) for i in range(done, m)]


def stage_order(schedule: str, p: int, s: int, m: int, v: int = 1) -> list[tuple]:
    """(pass, micro-batch) in the order stage s of p runs them: pass is "F" or "B" ("I" and "W"
    for the zero-bubble schedule's split backward); for the interleaved schedule (pass,
    micro-batch, chunk) of its v chunks (interleaved_order).

    1F1B (PipeDream-flush, Megatron's non-interleaved schedule): min(p-s-1, m) warm-up
    forwards, then one forward and one backward alternately, then the remaining backwards.
    GPipe: every forward, then every backward, micro-batches in order.
    """
    if not 0 <= s < p or m < 1:
        raise ValueError(f"stage {s} of {p}, {m} micro-batches")
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule == "1f1b":
        w = min(p - s - 1, m)
        order = [("F", i) for i in range(w)]
        for j in range(m - w):
            order += [("F", w + j), ("B", j)]
        return order + [("B", i) for i in range(m - w, m)]
    if schedule == "interleaved":
        return interleaved_order(p, s, m, v)
    if schedule == "zb1p":
        return zero_bubble_order(p, s, m)
    raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")


@record(frozen=True)
class StageCosts:
    """Durations (seconds) and sizes one rank of a stage needs to write its program."""

    layers: int                     # layers on this stage
    fwd_half_s: float               # one half-layer (attention or MLP) forward compute
    bwd_half_s: float               # one half-layer backward compute
    recompute_s: float              # forward recomputed before a layer's backward (0 without)
    tp_ar_s: float                  # one TP all-reduce; 0 when tp == 1
    tp_bytes: int
    p2p_s: float
    p2p_bytes: int
    buckets: tuple                  # ((last layer of bucket in backward order, bytes, seconds), ...)
    optimizer_s: float
    overlap_dp: bool
    chunks: int = 1                 # model chunks per rank (v of the interleaved schedule)
    weight_share: float = WEIGHT_SHARE  # zero-bubble: the weight gradients' share of a layer's backward
    weight_extra_s: float = 0.0     # zero-bubble: what torch's split backward adds a layer, paid in its weight pass
    tp: int = 1                     # TP size: its all-reduces are written even where one member stands for all
    # ZeRO (model.py): 1-2 reduce-scatter the buckets and all-gather the stage's parameters after
    # the optimizer; 3 all-gathers each layer's parameters before its forward and its backward
    # (one layer ahead, on the "ag" stream) and reduce-scatters its gradients after its backward
    # (on the "rs" stream), every micro-batch, with no buckets.
    zero: int = 0
    param_ag_s: float = 0.0         # ZeRO-1/2: the stage's parameters, all-gathered after the optimizer
    param_ag_bytes: int = 0
    layer_ag_s: float = 0.0         # ZeRO-3: one layer's parameters all-gathered
    layer_ag_bytes: int = 0
    layer_rs_s: float = 0.0         # ZeRO-3: one layer's gradients reduce-scattered
    layer_rs_bytes: int = 0
    blocking_gathers: bool = False  # ZeRO-3's collectives on the main stream, before / after the layer
    # Context parallelism (model.py, docs/model.md): each layer all-gathers K and V over the CP group
    # before its attention, in forward and again in backward (and in a recomputed forward), and after
    # its attention's backward passes its shard of dK, dV round the ring in cp permutes (torch's
    # all-gather rotate method and its backward), on the main stream (exposed). Written even where
    # one member stands for the group (cp > 1).
    cp: int = 1
    cp_s: float = 0.0               # one all-gather of a layer's K and V
    cp_bytes: int = 0
    cp_dkv_s: float = 0.0           # one permute of the rank's dK, dV shard (an all-to-all on the CP group)
    cp_dkv_bytes: int = 0
    action_s: float = 0.0           # the pipelining runtime's host time before each action but a step's first (after its receive)
    post_s: float = 0.0             # a transfer's post as an action of its own (POSTED_SCHEDULES): host time after
                                    # each receive and before each send


@record(frozen=True)
class Place:
    """Where a rank sits: its groups and pipeline neighbours."""

    rank: int
    stage: int
    stages: int
    tp_group: tuple
    dp_group: tuple
    pp_group: tuple
    prev_rank: Optional[int]
    next_rank: Optional[int]
    cp_group: tuple = ()


class ProgramWriter:
    """Appends one step's instructions for one rank; collective sequence numbers per group."""

    def __init__(self, place: Place, costs: StageCosts, step: int):
        self.p, self.c, self.step = place, costs, step
        self.main: list[Instr] = []
        self.dp: list[Instr] = []
        self.ag: list[Instr] = []       # ZeRO-3's parameter all-gathers
        self.rs: list[Instr] = []       # ZeRO-3's gradient reduce-scatters
        self._seq: dict = {}
        self._rs = 0
        self._closing = {b[0]: i for i, b in enumerate(costs.buckets)}   # layer that closes each bucket
        self.runtime = 0.0              # the pipelining runtime's host time before the next action's compute

    def _runtime(self) -> None:
        """The runtime's host time between two actions (StageCosts.action_s), after the action's
        receive: measured as idle no wait covers (ActionGaps), it is not hidden behind one here either."""
        if self.runtime > 0:
            self.main.append(Instr("idle", "pp runtime", self.runtime))
            self.runtime = 0.0

    def _post(self) -> None:
        """A transfer's post, an action of its own in torch's multi-stage runtime (StageCosts.post_s): host
        time that no wait hides (the runtime posts a receive actions ahead of the compute it feeds)."""
        if self.c.post_s > 0:
            self.main.append(Instr("idle", "pp post", self.c.post_s))

    def _key(self, *what) -> tuple:
        """An event key of this rank: launches and waits never pair across ranks."""
        return (what[0], self.p.rank, self.step) + what[1:]

    def _coll(self, axis: str, group: tuple, nbytes: int, dur: float, name: str, op: str = "all_reduce") -> Instr:
        n = self._seq.get(group, 0)
        self._seq[group] = n + 1
        return Instr("coll", name, dur, axis, op, nbytes, group, ("coll", self.step, group, n))

    def _gather(self, pass_key: tuple, j: int, n: int) -> None:
        """ZeRO-3: layer j of n of this pass waits for its parameters, all-gathered on the "ag"
        stream: the pass's first layer's when the pass starts (exposed), each next one's when the
        layer before it starts (FSDP's prefetch of one layer)."""
        c, key = self.c, self._key("ag", pass_key, j)
        gather = self._coll("dp", self.p.dp_group, c.layer_ag_bytes, c.layer_ag_s, "param_all_gather", "all_gather")
        if c.blocking_gathers:
            self.main.append(gather)
            return
        self.ag.append(Instr("wait", key=self._key("ag_go", pass_key, j)))
        self.ag.append(gather)
        self.ag.append(Instr("launch", key=key))
        if j == 0:
            self.main.append(Instr("launch", key=self._key("ag_go", pass_key, 0)))
        self.main.append(Instr("wait", key=key))
        if j + 1 < n:
            self.main.append(Instr("launch", key=self._key("ag_go", pass_key, j + 1)))

    def _scatter(self) -> None:
        """ZeRO-3: the layer's gradients reduce-scattered on the "rs" stream once its backward ends."""
        c = self.c
        scatter = self._coll("dp", self.p.dp_group, c.layer_rs_bytes, c.layer_rs_s, "grad_reduce_scatter",
                             "reduce_scatter")
        if c.blocking_gathers:
            self.main.append(scatter)
            return
        go = self._key("rs_go", self._rs)
        self.main.append(Instr("launch", key=go))
        self.rs.append(Instr("wait", key=go))
        self.rs.append(scatter)
        self.rs.append(Instr("launch", key=self._key("rs_done", self._rs)))
        self._rs += 1

    def _p2p(self, what: str, kind: str, mb: int, src: int, dst: int, to_chunk: int = 0) -> Instr:
        c = self.c
        return Instr(what, f"{what}_{kind}", c.p2p_s if what == "send" else 0.0, "pp", what,
                     c.p2p_bytes, self.p.pp_group, ("p2p", kind, self.step, mb, src, dst, to_chunk))

    def _virtual(self, chunk: int, delta: int) -> Optional[tuple[int, int]]:
        """(rank, chunk) of the virtual stage delta (+-1) away from this rank's `chunk`; None past
        either end. Virtual stage = chunk x p + stage: the last stage feeds chunk + 1 on stage 0."""
        p = self.p
        vs = chunk * p.stages + p.stage + delta
        if not 0 <= vs < p.stages * self.c.chunks:
            return None
        same = p.prev_rank if delta < 0 else p.next_rank
        return (same if same is not None else p.pp_group[vs % p.stages]), vs // p.stages

    def _half(self, name: str, dur: float) -> None:
        self.main.append(Instr("compute", name, dur))
        if self.c.tp > 1:
            self.main.append(self._coll("tp", self.p.tp_group, self.c.tp_bytes, self.c.tp_ar_s, "tp_all_reduce"))

    def _cp_gather(self) -> None:
        """CP: K and V all-gathered over the CP group before an attention; none at cp 1."""
        c = self.c
        if c.cp > 1:
            self.main.append(self._coll("cp", self.p.cp_group, c.cp_bytes, c.cp_s, "cp_kv_all_gather", "all_gather"))

    def _cp_permutes(self) -> None:
        """CP: after an attention's backward, the rank's dK, dV shard passed on cp times round the ring
        (torch's `permute_tensor`, an all-to-all on the CP group, once per ring step); none at cp 1."""
        c = self.c
        for _ in range(c.cp if c.cp > 1 else 0):
            self.main.append(self._coll("cp", self.p.cp_group, c.cp_dkv_bytes, c.cp_dkv_s, "cp_dkv_permute",
                                        "all_to_all"))

    def forward(self, mb: int, chunk: int = 0) -> None:
        p, per_chunk = self.p, self.c.layers // self.c.chunks
        if (src := self._virtual(chunk, -1)) is not None:
            self.main.append(self._p2p("recv", "act", mb, src[0], p.rank, chunk))
            self._post()
        self._runtime()
        for j in range(per_chunk):
            if self.c.zero >= 3:
                self._gather(("F", mb, chunk), j, per_chunk)
            self._cp_gather()
            self._half("fwd_attn", self.c.fwd_half_s)
            self._half("fwd_mlp", self.c.fwd_half_s)
        if (dst := self._virtual(chunk, +1)) is not None:
            self._post()
            self.main.append(self._p2p("send", "act", mb, p.rank, dst[0], dst[1]))

    def backward(self, mb: int, last: bool, chunk: int = 0, split: bool = False) -> None:
        """The backward pass of a micro-batch; with `split` only its input gradients (the
        zero-bubble schedule's "I": the weight gradients follow in weight())."""
        p, c = self.p, self.c
        per_chunk = c.layers // c.chunks
        if (src := self._virtual(chunk, +1)) is not None:
            self.main.append(self._p2p("recv", "grad", mb, src[0], p.rank, chunk))
            self._post()
        self._runtime()
        half = c.bwd_half_s * (1 - c.weight_share) if split else c.bwd_half_s
        for j, layer in enumerate(self._backward_layers(chunk)):
            if c.zero >= 3:
                self._gather(("B", mb, chunk), j, per_chunk)
            if c.recompute_s > 0:
                self._cp_gather()
                self.main.append(Instr("compute", "recompute_fwd", c.recompute_s))
            self._half("bwd_mlp", half)
            self._cp_gather()
            self._half("bwd_attn", half)
            self._cp_permutes()
            if not split:
                self._gradients_ready(layer, last)
        if (dst := self._virtual(chunk, -1)) is not None:
            self._post()
            self.main.append(self._p2p("send", "grad", mb, p.rank, dst[0], dst[1]))

    def weight(self, mb: int, last: bool, chunk: int = 0) -> None:
        """The zero-bubble schedule's weight-gradient pass ("W"): no communication of its own;
        the layer's gradients are ready after it (DP bucket, ZeRO-3 reduce-scatter). It carries the
        split backward's extra (StageCosts.weight_extra_s)."""
        self._runtime()
        for layer in self._backward_layers(chunk):
            self.main.append(Instr("compute", "bwd_weight", 2 * self.c.bwd_half_s * self.c.weight_share
                                   + self.c.weight_extra_s))
            self._gradients_ready(layer, last)

    def _backward_layers(self, chunk: int) -> range:
        """This chunk's layers in the stage's backward order (later chunks first)."""
        per_chunk = self.c.layers // self.c.chunks
        first = (self.c.chunks - 1 - chunk) * per_chunk
        return range(first, first + per_chunk)

    def _gradients_ready(self, layer: int, last: bool) -> None:
        if self.c.zero >= 3:
            self._scatter()
        if last and self.c.overlap_dp and layer in self._closing:
            self.main.append(Instr("launch", key=self._key("bucket", self._closing[layer])))

    def grad_sync_and_optimizer(self) -> None:
        """The DP gradient buckets (all-reduced; reduce-scattered under ZeRO-1/2), or under ZeRO-3
        the wait for the last reduce-scatter; the optimizer; ZeRO-1/2's parameter all-gather."""
        c, p = self.c, self.p
        stream = self.dp if c.overlap_dp else self.main
        op = "reduce_scatter" if c.zero else "all_reduce"
        for i, (_, nbytes, dur) in enumerate(c.buckets):
            if c.overlap_dp:
                self.dp.append(Instr("wait", key=self._key("bucket", i)))
            stream.append(self._coll("dp", p.dp_group, nbytes, dur, f"dp_bucket_{i}", op))
        if c.overlap_dp and c.buckets:
            self.dp.append(Instr("launch", key=self._key("dp_done")))
            self.main.append(Instr("wait", key=self._key("dp_done")))
        if self._rs:
            self.main.append(Instr("wait", key=self._key("rs_done", self._rs - 1)))
        if c.optimizer_s > 0:
            self.main.append(Instr("compute", "optimizer", c.optimizer_s))
        if c.param_ag_bytes and len(p.dp_group) > 1:
            self.main.append(self._coll("dp", p.dp_group, c.param_ag_bytes, c.param_ag_s, "param_all_gather",
                                        "all_gather"))


STREAMS = ("main", "dp", "ag", "rs")


def step_program(schedule: str, m: int, place: Place, costs: StageCosts, step: int,
                 delay_s: float = 0.0) -> dict[str, list[Instr]]:
    """Instructions of one rank for one step, per stream (STREAMS): the passes and TP
    all-reduces ("main"), the overlapped DP buckets ("dp"), ZeRO-3's all-gathers and
    reduce-scatters ("ag", "rs")."""
    w = ProgramWriter(place, costs, step)
    w.main.append(Instr("mark", key=("step", step)))
    if delay_s > 0:
        w.main.append(Instr("idle", "straggler delay", delay_s))
    for i, (kind, mb, *chunk) in enumerate(stage_order(schedule, place.stages, place.stage, m, costs.chunks)):
        ch = chunk[0] if chunk else 0
        w.runtime = costs.action_s if i else 0.0
        if kind == "F":
            w.forward(mb, ch)
        elif kind == "W":
            w.weight(mb, last=mb == m - 1, chunk=ch)
        else:
            w.backward(mb, last=mb == m - 1, chunk=ch, split=kind == "I")
    w.grad_sync_and_optimizer()
    return {"main": w.main, "dp": w.dp, "ag": w.ag, "rs": w.rs}


class Engine:
    """Runs every stream's program as far as its dependencies allow, until all are done."""

    def __init__(self, programs: dict):
        self.programs = programs
        self.pc = {sid: 0 for sid in programs}
        self.now = {sid: 0.0 for sid in programs}
        self.events: dict = {}
        self.arrivals: dict = defaultdict(dict)
        self.records: dict = defaultdict(list)
        self.marks: dict = defaultdict(list)

    def run(self):
        progress = True
        while progress:
            progress = False
            for sid, prog in self.programs.items():
                while self.pc[sid] < len(prog):
                    step, ins = prog[self.pc[sid]]
                    t = self._advance(sid, step, ins)
                    if t is None:
                        break
                    self.now[sid], self.pc[sid], progress = t, self.pc[sid] + 1, True
        stuck = [sid for sid, prog in self.programs.items() if self.pc[sid] < len(prog)]
        if stuck:
            raise RuntimeError(f"the schedule deadlocks: {stuck[:4]} wait on {[self.programs[s][self.pc[s]][1] for s in stuck[:2]]}")
        return self.records, self.marks, {r: t for (r, s), t in self.now.items() if s == "main"}

    def _record(self, sid, step, ins: Instr, start: float, end: float) -> None:
        kind = "compute" if ins.what == "compute" else "comm"
        op = ins.op if kind == "comm" else None
        self.records[sid[0]].append((start, end - start, kind, ins.name, ins.axis, op, ins.nbytes, ins.group, step, sid[1]))

    def _advance(self, sid, step, ins: Instr) -> Optional[float]:
        t, w = self.now[sid], ins.what
        if w == "mark":
            self.marks[sid[0]].append(t)
            return t
        if w == "idle":
            return t + ins.dur_s
        if w == "launch":
            self.events[ins.key] = t
            return t
        if w == "wait":
            return max(t, self.events[ins.key]) if ins.key in self.events else None
        if w in ("compute", "send"):
            self._record(sid, step, ins, t, t + ins.dur_s)
            if w == "send":
                self.events[ins.key] = t + ins.dur_s
            return t + ins.dur_s
        if w == "recv":
            if ins.key not in self.events:
                return None
            end = max(t, self.events[ins.key])
        else:  # coll: every member of the group must have arrived
            arrived = self.arrivals[ins.key]
            arrived.setdefault(sid[0], t)
            if len(arrived) < len(ins.group):
                return None
            end = max(arrived.values()) + ins.dur_s
        self._record(sid, step, ins, t, end)
        return end
