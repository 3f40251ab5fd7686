"""The rank grid: Megatron rank order, groups, and that it needs no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from diag.layout import Axis, RankGrid


def test_megatron_rank_order():
    grid = RankGrid(tp=2, pp=2, dp=2)
    # rank = tp_rank + tp * (dp_rank + dp * pp_rank)
    assert grid.rank(tp_rank=1, pp_rank=0, dp_rank=0) == 1
    assert grid.rank(tp_rank=0, pp_rank=0, dp_rank=1) == 2
    assert grid.rank(tp_rank=0, pp_rank=1, dp_rank=0) == 4
    assert tuple(grid.coords(7)) == (1, 1, 1)


def test_coords_and_rank_are_inverse():
    grid = RankGrid(tp=2, pp=3, dp=4)
    for r in range(grid.world_size):
        c = grid.coords(r)
        assert grid.rank(c.tp_rank, c.pp_rank, c.dp_rank) == r


def test_groups_partition_the_world():
    grid = RankGrid(tp=2, pp=2, dp=2)
    assert grid.groups(Axis.TP) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups(Axis.PP) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for axis in Axis:
        flat = sorted(r for g in grid.groups(axis) for r in g)
        assert flat == list(range(8))
        assert all(len(g) == grid.size(axis) for g in grid.groups(axis))
    assert grid.group_of(5, Axis.DP) == [5, 7]


def test_axis_is_a_string():
    assert f"{Axis.TP}" == "tp" and Axis("pp") is Axis.PP


@pytest.mark.parametrize("kwargs", [dict(tp=0, pp=1, dp=1), dict(tp=1, pp=-1, dp=1),
                                    dict(tp=1, pp=1, dp=1.5)])
def test_invalid_sizes_refused(kwargs):
    with pytest.raises(ValueError):
        RankGrid(**kwargs)


def test_from_world_refuses_indivisible():
    with pytest.raises(ValueError, match="not divisible"):
        RankGrid.from_world(6, tp=4, pp=1)
    assert RankGrid.from_world(8, tp=2, pp=2) == RankGrid(2, 2, 2)


def test_importable_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import diag.layout as t; "
            "print(t.RankGrid(2, 1, 2).coords(3))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
