"""torch.profiler on a wait/warmup/active schedule, one gzipped Chrome trace per rank.

The analyser reads `<out>/rank-<r>.pt.trace.json.gz`; steps are marked with `prof.step()` so the
trace holds `ProfilerStep#N` ranges. Any profiler failure (start, step, export) disables the
profiler with one warning and training goes on: a run without a trace is worth more than no run.

When the trace is written, the rank summarises it (`diag summarize`, the per-rank pass of the
analysis) in an idle-class subprocess (it runs on CPU time training leaves unused), so the work
of analysing a big job is spread over its own nodes and `diag analyze` merges the summaries in
seconds. The subprocess never holds the GIL of the training process; at exit the session waits
for it (telemetry.summarizer: restarted at training's priority if other work starves it). If it
fails or is late, one warning: `diag analyze` then reads the trace itself.
"""

from __future__ import annotations

import os

import torch

from diag.trace.safeio import exclusive_temp_path

from . import memory
from .safe import guard, warn_once
from .summarizer import Summarizer


def trace_path(out: str, rank: int) -> str:
    return os.path.join(out, f"rank-{rank}.pt.trace.json.gz")


class ProfilerSession:
    """Context manager around torch.profiler.profile; `step()` after every training step.

    `factory` is torch.profiler.profile by default; tests pass one that fails. Given
    `persistent` (a function returning the bytes of what outlives a step), a CPU run also
    records the allocator's events and measures each profiled step's peak (`step_peaks`, from
    telemetry.memory; None if that failed).
    """

    def __init__(self, cfg, rank: int, cuda: bool, factory=None, persistent=None) -> None:
        self.cfg, self.rank, self.cuda = cfg, rank, cuda
        self.factory = factory or torch.profiler.profile
        self.prof = None
        self.exported: str | None = None
        self.summarizer: Summarizer | None = None
        self.persistent = persistent if cfg.profile and not cuda else None
        self.baseline: int | None = None
        self.step_peaks: dict[int, int] | None = None

    def _take_baseline(self) -> None:
        """When the window opens: the bytes its allocation counter cannot see."""
        from torch.profiler import ProfilerAction

        if self.persistent is None or self.prof is None:
            return
        if getattr(self.prof, "current_action", None) in (ProfilerAction.RECORD,
                                                          ProfilerAction.RECORD_AND_SAVE):
            persistent, self.persistent = self.persistent, None  # once, even if it fails
            with guard("peak memory"):
                self.baseline = persistent()

    def _export(self, prof) -> None:
        if self.baseline is not None:
            with guard("peak memory"):
                self.step_peaks = memory.step_peaks(prof, self.baseline)
        with guard("profiler export"):
            os.makedirs(self.cfg.out, exist_ok=True)
            path = trace_path(self.cfg.out, self.rank)
            # Written in a private directory made with mkdtemp next to the trace (a name nobody
            # can plant a symlink under), then renamed: a rank killed or a disk filling up
            # mid-write never leaves a partial file under the final name.
            with exclusive_temp_path(path) as partial:     # ends in .gz: torch gzips the JSON itself
                prof.export_chrome_trace(partial)
            self.exported = path
        if self.exported and getattr(self.cfg, "trace_summary", False):
            with guard("trace summary"):
                self.summarizer = Summarizer(self.exported)

    def _wait_summary(self) -> None:
        summarizer, self.summarizer = self.summarizer, None
        if summarizer is not None:
            with guard("trace summary"):
                summarizer.wait()

    def __enter__(self) -> "ProfilerSession":
        if not self.cfg.profile:
            return self
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with guard("profiler"):
            prof = self.factory(
                activities=activities,
                schedule=torch.profiler.schedule(wait=self.cfg.profile_wait,
                                                 warmup=self.cfg.profile_warmup,
                                                 active=self.cfg.profile_active, repeat=1),
                on_trace_ready=self._export,
                record_shapes=True,
                # --profile-memory, or on CPU always: the measured peak is read from these events
                profile_memory=self.cfg.profile_memory or self.persistent is not None,
            )
            prof.__enter__()
            self.prof = prof
        self._take_baseline()  # a window that opens at the first step
        return self

    def step(self) -> None:
        if self.prof is None:
            return
        try:
            self.prof.step()
        except Exception as exc:  # noqa: BLE001 - a broken profiler must not stop training
            warn_once("profiler", exc)
            self._stop()
        self._take_baseline()

    def _stop(self) -> None:
        prof, self.prof = self.prof, None
        if prof is not None:
            with guard("profiler stop"):
                prof.__exit__(None, None, None)

    def __exit__(self, *exc) -> None:
        self._stop()
        self._wait_summary()
