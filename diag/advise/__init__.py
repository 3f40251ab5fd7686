"""Step-time model of a 3D-parallel schedule, and traces synthesised from it.

The same model predicts what a configuration change buys and writes traces with known
truth that the analyser's tests recover (synth.py, tests/test_oracles.py).
"""
from .model import (Config, Links, RankOps, Timeline, Workload, allreduce_s, bubble_fraction, gather_s, p2p_s,
                    simulate, step_time)
from .schedule import stage_order

__all__ = ["Config", "Links", "RankOps", "Timeline", "Workload", "allreduce_s", "bubble_fraction", "gather_s",
           "p2p_s", "simulate", "stage_order", "step_time"]
