"""How a test worker ends: its record written, the process group destroyed, then `os._exit(0)`.

gloo's ProcessGroupGloo joins its worker threads in its destructor. Where the last reference to
it, or to a Work that holds it, goes on one of those threads or during the interpreter's
finalisation, the join cannot happen and std::terminate aborts the process ("terminate called
without an active exception", pytorch/pytorch#190489; #179291 on finalisation). The one-rank
tap workers ended so three times (a clean-clone CI run, a busy-machine run, one more CI run),
each after their record was whole; 25 runs beside CPU burners did not reproduce it. What a worker
is run for is its record: nothing after `destroy_process_group` is under test, so it leaves
without the destructors."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def finish() -> None:
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
