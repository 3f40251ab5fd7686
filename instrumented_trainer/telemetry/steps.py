"""Per-step record of the run: `<out>/steps.jsonl` and a one-line summary on stdout.

Written by one rank only (the last pipeline stage's TP-rank-0, DP-rank-0 rank, which holds the
DP-averaged loss), one JSON object per step: step, loss, step_seconds, tokens_per_second, and
peak_memory_bytes: the largest of all ranks' peaks in that step: the CUDA allocator's on GPU; on
CPU, where torch keeps no allocator counters, the profiler's allocation events (telemetry.memory),
so only the profiled steps have one (their rows are written when the window closes and the
peaks are known); null where nothing was measured (not a measured 0).
"""

from __future__ import annotations

import os
import statistics

from .safe import JsonlWriter


class StepLog:
    def __init__(self, out: str, enabled: bool, tokens_per_step: int, train_iters: int) -> None:
        self.enabled = enabled
        self.tokens_per_step, self.train_iters = tokens_per_step, train_iters
        self.writer = (JsonlWriter(os.path.join(out, "steps.jsonl"), "steps log") if enabled
                       else None)
        self.losses: list[float] = []
        self.last: dict = {}  # every rank keeps its latest step for the Prometheus exporter
        self.count = 0
        self.peak: int | None = None  # the largest measured peak (every rank: they are reduced)
        self.pending: list[dict] = []  # rows waiting for their peak (the profiled steps on CPU)
        self.seconds: dict[int, float] = {}  # every rank: its step times, by step

    def record(self, step: int, loss: float, seconds: float,
               peak_memory_bytes: int | None = None, pending: bool = False) -> None:
        tps = self.tokens_per_step / seconds if seconds > 0 else 0.0
        self.last = {"step": step, "loss": loss, "step_seconds": seconds,
                     "tokens_per_second": tps, "peak_memory_bytes": peak_memory_bytes}
        self.count += 1
        self.seconds[step] = seconds
        self._note_peak(peak_memory_bytes)
        if not self.enabled:
            return
        self.losses.append(loss)
        if pending:
            self.pending.append(self.last)
        else:
            self.writer.append(self.last)
            self.writer.flush()
        print(f"step {step + 1:>4}/{self.train_iters} | loss {loss:.6f} | "
              f"{seconds * 1e3:8.1f} ms | {tps:10.0f} tokens/s", flush=True)

    def _note_peak(self, value: int | None) -> None:
        if value is not None:
            self.peak = value if self.peak is None else max(self.peak, value)

    def resolve(self, peaks: dict[int, int | None]) -> None:
        """Fill in the pending rows' peaks and write them."""
        for value in peaks.values():
            self._note_peak(value)
        rows, self.pending = self.pending, []
        for row in rows:
            row["peak_memory_bytes"] = peaks.get(row["step"])
            self.writer.append(row)
        if rows:
            self.writer.flush()

    def untraced_median(self, traced: range) -> float | None:
        """Median step time outside the profiler's `traced` steps and the export step after them,
        the first step (allocator and gloo warm-up) left out; None with none such."""
        times = [t for s, t in self.seconds.items() if s >= 1 and not (traced and traced.start <= s <= traced.stop)]
        return statistics.median(times) if times else None

    def close(self) -> None:
        self.resolve({})  # a window that never closed: its rows are written with null peaks
        if self.writer is not None:
            self.writer.close()
