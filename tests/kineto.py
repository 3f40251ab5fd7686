"""Write small Kineto-format traces for tests, with times chosen so results can be worked by hand.

Events are given in microseconds. GPU kernels get a matching `cuda_runtime` launch
(same correlation) at `launch_us` so the analysis window can place them in steps.
"""
from __future__ import annotations

import gzip
import json
import os
from itertools import count
from typing import Optional


class TraceBuilder:
    def __init__(self, rank: int = 0, world_size: int = 1, backend: str = "nccl", pid: int = 100,
                 device: int = 0, base_ts: float = 1_000_000.0):
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.pid, self.device, self.base = pid, device, base_ts
        self.events: list[dict] = []
        self.pg_config: list[dict] = []      # distributedInfo.pg_config, when given
        self.host: Optional[str] = None       # the header's host_name, when given
        self._corr = count(1)

    def step(self, n: int, ts: float, dur: float) -> "TraceBuilder":
        self.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}",
                            "pid": self.pid, "tid": self.pid, "ts": self.base + ts, "dur": dur,
                            "args": {"External id": n}})
        return self

    def cpu_op(self, name: str, ts: float, dur: float, tid: Optional[int] = None, cat: str = "cpu_op",
               **args) -> "TraceBuilder":
        """args: more event args by their Kineto names, e.g. **{"Input Dims": [[64]]}."""
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid,
                            "tid": self.pid if tid is None else tid, "ts": self.base + ts, "dur": dur,
                            "args": {"External id": 0, **args}})
        return self

    def kernel(self, name: str, ts: float, dur: float, stream: int = 7, launch_us: Optional[float] = None,
               cat: str = "kernel", **args) -> "TraceBuilder":
        corr = next(self._corr)
        launch = ts - 1.0 if launch_us is None else launch_us
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": self.pid,
                            "tid": self.pid, "ts": self.base + launch, "dur": 0.5,
                            "args": {"correlation": corr, "External id": corr}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.device, "tid": stream,
                            "ts": self.base + ts, "dur": dur,
                            "args": {"device": self.device, "stream": stream, "correlation": corr,
                                     "External id": corr, **args}})
        return self

    def doc(self) -> dict:
        return {"schemaVersion": 1, "deviceProperties": [{"id": self.device, "name": "Test GPU"}],
                "distributedInfo": {"backend": self.backend, "rank": self.rank, "world_size": self.world_size,
                                    **({"pg_config": self.pg_config} if self.pg_config else {})},
                **({"host_name": self.host} if self.host else {}), "traceEvents": self.events}

    def write(self, path: str, gz: Optional[bool] = None) -> str:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        data = json.dumps(self.doc()).encode()
        if gz if gz is not None else path.endswith(".gz"):
            data = gzip.compress(data)
        with open(path, "wb") as f:
            f.write(data)
        return path
