"""What every rule needs to turn evidence into a Recommendation: pricing and the re-run command.

Problem: the rules (rules.py) should each read like one paragraph of reasoning. The shared
work lives here: pricing candidate configurations with the calibrated model and keeping the
best, the confidence that follows from how well the model fits the measured run, and the
exact command that re-runs the job with the changed flags.
"""
from __future__ import annotations

import shlex
from dataclasses import field, replace
from typing import Callable, Optional

from ..analysis.results import AxisOverlap, Diagnosis
from . import memory as mem
from .calibrate import Calibration
from .model import Config, ModelTooBig
from .results import Evidence, Recommendation, amount
from ..record import record

MIN_GAIN = 0.02            # a change the model prices under 2% of the step is not worth a re-run
# Megatron-LM's uneven split of the layers (the trainer's too): the first and last stage's own counts
SPLIT_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
# what the step-time model takes sequence parallelism to cost, and what the closed loop measured
SP_TIME = ("sequence parallelism's time priced as its all-gathers and reduce-scatters on the run's TP link and its "
           "reductions of the norms' gradients (calibration notes); DTensor's own host time for its extra "
           "redistributions is not priced")
PREFER_SHARE = 0.8         # with `prefer`, the smallest change within 80% of the best predicted gain


def ev(metric: str, value: float, threshold: float, unit: str, source: str = "") -> Evidence:
    return Evidence(metric=metric, value=float(value), threshold=float(threshold), unit=unit, source=source)


def rerun_command(command: Optional[str], flags: dict, rule: str) -> Optional[str]:
    """The run's command with `flags` set (value "" = a switch, None = removed) and a new --out."""
    if not command:
        return None
    args = shlex.split(command)
    out = {}
    for i, a in enumerate(args):
        if a == "--out" and i + 1 < len(args):
            out["--out"] = args[i + 1].rstrip("/") + f"-{rule}"
    for flag, value in {**flags, **out}.items():
        if flag in args:
            i = args.index(flag)
            has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            del args[i:i + 1 + has_value]
        if value is not None:
            args += [flag] + ([value] if value != "" else [])
    return shlex.join(args)


def _confidence(fit_error: float) -> str:
    return "high" if fit_error <= 0.10 else "medium" if fit_error <= 0.25 else "low"


@record
class Context:
    """What every rule reads: the diagnosis, the calibrated model and the memory model."""

    d: Diagnosis
    cal: Optional[Calibration]
    step_s: Optional[float]
    memory: Optional[mem.MemoryModel] = None
    mem_config: Optional[mem.MemoryConfig] = None    # the measured run's
    capacity: Optional[float] = None                 # bytes per device; None: unknown
    dropped: list = field(default_factory=list)      # changes that do not fit, in words
    declined: list = field(default_factory=list)     # changes a rule priced and did not propose, and why
    memory_unknown: str = "peak memory not modelled"  # why, when memory is None

    def _memory(self, rec: Recommendation, config: Optional[Config], workload, changes: dict) -> bool:
        """Put the modelled peaks on rec; pair it with the least ZeRO stage that makes it fit.
        False when nothing makes it fit (rec is then dropped and said in ctx.dropped)."""
        if self.memory is None or self.mem_config is None:
            rec.assumptions.append(f"{self.memory_unknown}: check the new configuration fits")
            return True
        now = self.memory.peak(self.mem_config)
        after_cfg = replace(self.mem_config, **changes)
        if config is not None:
            after_cfg = replace(after_cfg, tp=config.tp, pp=config.pp, dp=config.dp, cp=config.cp,
                                micro_batch_size=config.micro_batch_size, num_micro_batches=config.num_micro_batches,
                                schedule=config.schedule, virtual_stages=config.virtual_stages)
            if self._drops_split(config):
                after_cfg = replace(after_cfg, first_stage_layers=0, last_stage_layers=0)
        after = self.memory.peak(after_cfg)
        rec.memory_capacity_bytes = self.capacity
        if self.capacity and after.total > self.capacity:
            fit = self.memory.fitting(after_cfg, self.capacity)
            if fit is None:
                self.dropped.append(f"{rec.title}: {mem.human(after.total)} per rank modelled, over the "
                                    f"{mem.human(self.capacity)} device even with ZeRO-3 ({after.arithmetic()})")
                return False
            over, words = after, mem.lever_words(after_cfg, fit)
            after = self.memory.peak(fit)
            rec.title += f", with {words} to fit"
            rec.flags.update(mem.lever_flags(after_cfg, fit))
            rec.memory.append(f"without {words}: {over.arithmetic()}: over the device's {mem.human(self.capacity)}")
            if not self._reprice(rec, config, workload, after_cfg, fit):
                self.dropped.append(f"{rec.title}: with {words} it is no longer faster")
                return False
            if rec.command:
                rec.command = rerun_command(self.d.run.command if self.d.run else None, rec.flags, rec.rule)
        rec.memory_before_bytes, rec.memory_after_bytes = now.total, after.total
        if after.total != now.total:     # the model's basis and the peak now are in the calibration notes
            rec.memory.insert(0, f"after: {after.arithmetic()}")
        return True

    def _drops_split(self, config: Optional[Config]) -> bool:
        """Whether a change leaves the run's uneven split (Megatron-LM's first/last stage layers) behind:
        it changes the pipeline's stages (PP, or the virtual stages they are counted over), for which
        those counts were not chosen; the change is then priced, and its command set, with an even split."""
        lay = self.mem_config
        return (config is not None and lay is not None and mem.uneven(lay)
                and (config.pp != lay.pp or config.virtual_stages != lay.virtual_stages))

    def axis(self, name: str) -> Optional[AxisOverlap]:
        return next((a for a in (self.d.comm.axes if self.d.comm else []) if a.axis == name), None)

    def _reprice(self, rec: Recommendation, config: Optional[Config], workload, before: mem.MemoryConfig,
                 fit: mem.MemoryConfig) -> bool:
        """The step with the levers that make it fit priced: ZeRO's traffic (model.py), full recompute's
        extra forward and sequence parallelism's collectives and norm reductions (model.sp_costs); selective
        recompute moves what it moved before (docs/model.md). False if it is no longer a gain."""
        zero, full = fit.zero != before.zero, fit.recompute == "full" and before.recompute != "full"
        sp = fit.sequence_parallel and not before.sequence_parallel
        if sp:
            rec.assumptions.append(SP_TIME)
        if not (zero or full or sp):
            return True
        if self.cal is None or config is None or not self.step_s:
            rec.assumptions.append("the fitting levers' cost (ZeRO traffic, recompute, sequence parallelism) is not priced in the step time")
            return True
        w = workload or self.cal.workload
        rec.step_s_after = self.cal.predict(replace(config, zero=fit.zero if zero else config.zero,
                                                    sequence_parallel=config.sequence_parallel or sp),
                                            replace(w, recompute="full") if full else w)
        tokens = self.cal.tokens_per_step
        rec.tokens_per_s_after = tokens / rec.step_s_after if tokens else None
        if fit.recompute == "selective" and before.recompute != "selective":
            rec.assumptions.append("selective recompute's attention recompute not priced")
        return rec.step_s_after <= self.step_s * (1 - MIN_GAIN)

    def make(self, rule: str, title: str, evidence: list, flags: dict, after: Optional[float],
             confidence: Optional[str] = None, config: Optional[Config] = None, memory: Optional[dict] = None,
             workload=None, **kw) -> list[Recommendation]:
        """One recommendation, or none when the predicted gain is below MIN_GAIN."""
        if after is not None and self.step_s and rule != "straggler" and after > self.step_s * (1 - MIN_GAIN):
            self._decline(title, after, evidence)
            return []
        conf = confidence or (_confidence(self.cal.fit_error) if self.cal else "low")
        runnable = kw.pop("runnable", True)
        assumptions = kw.pop("assumptions", [])
        if self._drops_split(config):
            flags = {**flags, **{f: None for f in SPLIT_FLAGS}}
            assumptions = [*assumptions, "the layers split evenly over the new stages (the run's own first/last "
                                         "stage counts are for its present stages)"]
        cmd = rerun_command(self.d.run.command if self.d.run else None, flags, rule) if flags and runnable else None
        tokens = (self.cal.tokens_per_step if self.cal else None) or \
            (self.d.throughput.tokens_per_step if self.d.throughput else None)
        rate = (lambda s: tokens / s if tokens and s else None)
        rec = Recommendation(rule=rule, title=title, evidence=evidence, flags=dict(flags), command=cmd,
                             step_s_before=self.step_s, step_s_after=after,
                             tokens_per_s_before=rate(self.step_s), tokens_per_s_after=rate(after),
                             confidence=conf, runnable=runnable, assumptions=list(assumptions), **kw)
        moves = config is not None or memory is not None
        return [rec] if not moves or self._memory(rec, config, workload, memory or {}) else []

    def _decline(self, title: str, after: float, evidence: list) -> None:
        """A change a rule's evidence called for that the model prices under MIN_GAIN: said with its
        price and the evidence (Advice's "not proposed" notes), not dropped without a word, so a run
        whose losses crossed thresholds does not read as one with nothing to look at. Its callers
        have a step to price against."""
        change = after / self.step_s - 1
        price = (f"{100 * change:+.1f}% predicted: " + ("no faster" if change >= 0 else
                 f"under the {MIN_GAIN:.0%} a re-run is worth"))
        seen = "".join(f"; {e.metric} = {amount(e.value, e.unit)} (threshold {amount(e.threshold, e.unit)})"
                       for e in evidence[:1])
        self.declined.append(f"{title} ({price}){seen}")

    def best(self, rule: str, candidates: list, evidence: list, title: Callable, slowdown=None,
             prefer: Optional[Callable] = None, **kw) -> list[Recommendation]:
        """Price (config, workload or None, flags) candidates with the model; propose the fastest."""
        if not candidates:
            return []
        priced = []
        for c, w, f in candidates:
            try:
                priced.append((self.cal.predict(c, w, slowdown), c, f, w))
            except ModelTooBig:                      # past what the model simulates: not priced
                continue
            except ValueError:                       # a layout its schedule cannot take (layers or micro-
                continue                             # batches not divisible as interleaved 1F1B needs)
        if not priced:
            return []
        after, config, flags, work = min(priced, key=lambda x: x[0])
        if self.step_s and after >= self.step_s:    # no candidate is predicted to be faster
            self._decline(title(config), after, evidence)
            return []
        if prefer is not None and self.step_s:      # the smallest change that gets most of the best gain
            enough = [x for x in priced if self.step_s - x[0] >= PREFER_SHARE * (self.step_s - after)]
            after, config, flags, work = min(enough, key=lambda x: prefer(x[1]))
        alts = [f"{title(c)}: {a * 1e3:,.1f} ms predicted" for a, c, *_ in sorted(priced, key=lambda x: x[0])[1:]]
        kw["assumptions"] = kw.get("assumptions", []) + (["other candidates: " + "; ".join(alts)] if alts else [])
        return self.make(rule, title(config), evidence, flags, after, config=config, workload=work, **kw)
