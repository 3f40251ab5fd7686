"""The N-dimensional layout, and the layout of a job found from its traces' process groups."""
from __future__ import annotations

import gzip
import itertools
import json
import os

import pytest

from conftest import DATA
from diag.analysis.layoutfind import compact_pg_config, find_layout, group_key
from diag.layout import AXES, Layout, RankGrid, axis_of_desc, stage_layer_counts


def test_megatron_order_with_every_axis():
    # innermost first tp-cp-ep-dp_shard-dp-pp: rank = tp + 2 (cp + 2 (ep + 2 (dp_shard + 2 (dp + 2 pp))))
    lay = Layout.megatron(tp=2, cp=2, ep=2, dp_shard=2, dp=2, pp=2)
    assert lay.world_size == 64 and lay.axes == ("pp", "dp", "dp_shard", "ep", "cp", "tp")
    for tp, cp, ep, sh, dp, pp in itertools.product(range(2), repeat=6):
        r = tp + 2 * (cp + 2 * (ep + 2 * (sh + 2 * (dp + 2 * pp))))
        c = lay.coords(r)
        assert (c["tp"], c["cp"], c["ep"], c["dp_shard"], c["dp"], c["pp"]) == (tp, cp, ep, sh, dp, pp)
        assert lay.rank(tp=tp, cp=cp, ep=ep, dp_shard=sh, dp=dp, pp=pp) == r
    assert lay.group_of(0, "cp") == [0, 2] and lay.group_of(0, "pp") == [0, 32]
    assert lay.group_of(5, ("dp_shard", "cp")) == [5, 7, 13, 15]   # strides 2 (cp) and 8 (dp_shard)
    assert lay.group_of(5, "dp_shard_cp") == lay.group_of(5, ("dp_shard", "cp"))


def test_any_order_and_groups_partition_the_world():
    lay = Layout((("dp", 3), ("tp", 2), ("pp", 2)))          # pp innermost, as DeviceMesh may be given
    assert lay.world_size == 12 and lay.group_of(0, "pp") == [0, 1] and lay.group_of(0, "tp") == [0, 2]
    for axis in ("tp", "pp", "dp", "cp"):
        groups = lay.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(12))
        assert all(len(g) == lay.size(axis) for g in groups)
    assert lay.describe() == "dp3 × tp2 × pp2"


def test_rankgrid_is_the_3d_layout():
    assert RankGrid(tp=2, pp=2, dp=2) == Layout.from_world(8, tp=2, pp=2)
    assert RankGrid(tp=2, pp=2, dp=2).coords(6).dp_rank == 1
    with pytest.raises(ValueError, match="not divisible"):
        Layout.from_world(12, tp=8)
    with pytest.raises(ValueError):
        Layout((("tp", 2), ("tp", 2)))


@pytest.mark.parametrize("desc,axis", [("mesh_tp", "tp"), ("mesh_dp_shard", "dp_shard"), ("mesh_dp_replicate", "dp"),
                                       ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
                                       ("CONTEXT_PARALLEL_GROUP", "cp"), ("default_pg", None), ("undefined", None)])
def test_group_descriptions(desc, axis):
    assert axis_of_desc(desc) == axis


def _pg_configs(layout: Layout, desc: dict) -> list[list]:
    """Each rank's pg_config as torch writes it, for the groups of `layout` it belongs to."""
    out = []
    for r in range(layout.world_size):
        pgs = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": layout.world_size,
                "ranks": list(range(layout.world_size))}]
        for i, axis in enumerate(layout.axes):
            g = layout.group_of(r, axis)
            pgs.append({"pg_name": str(i + 1), "pg_desc": desc.get(axis, "undefined"), "pg_size": len(g), "ranks": g})
        out.append(compact_pg_config(pgs))
    return out


B200 = os.path.join(DATA, "b200_rank0_of_8_eager", "eager_trace.json.gz")


def test_one_rank_groups_are_not_asked_about():
    """A framework that makes a group for every axis makes one of one rank for each axis of size 1
    (TP, CP, EP ... at 1): it moves nothing, so the note asking for the sizes of unnamed groups leaves
    it out. The real B200 trace (rank 0 of 8; its pg_config lists 15 of its 71 groups) has 8 such
    groups and only 8-rank ones besides; it read "process groups of 1 ranks (irregular) are not
    named in the trace: give the sizes ..."."""
    truth = Layout.megatron(tp=4, pp=2, dp=2)
    configs = _pg_configs(truth, {})
    configs = [[*pgs, [f"9{r}", "undefined", [r]]] for r, pgs in enumerate(configs)]
    notes = " ".join(find_layout(configs, 16).notes)
    assert "4 ranks (consecutive)" in notes and "1 rank" not in notes
    with gzip.open(B200) as f:
        info = json.load(f)["distributedInfo"]
    assert sorted(g["pg_size"] for g in info["pg_config"]) == [1] * 8 + [8] * 7
    b200 = find_layout([compact_pg_config(info["pg_config"])], info["world_size"])
    assert not any("not named in the trace" in n for n in b200.notes)


def test_layout_from_device_mesh_names():
    truth = Layout((("pp", 2), ("dp", 2), ("tp", 2)))
    jl = find_layout(_pg_configs(truth, {a: f"mesh_{a}" for a in truth.axes}), 8)
    assert jl.layout == truth and jl.source == "process-group names"
    assert AXES[jl.axis_of("0,1")] == "tp" and AXES[jl.axis_of("0,2")] == "dp" and AXES[jl.axis_of("0,4")] == "pp"
    assert [jl.stage(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert jl.describe() == "pp2 × dp2 × tp2, from process-group names"


def test_names_beat_flags_and_say_so():
    truth = Layout((("pp", 2), ("dp", 2), ("tp", 2)))
    jl = find_layout(_pg_configs(truth, {a: f"mesh_{a}" for a in truth.axes}), 8, flags={"tp": 4})
    assert jl.layout == truth and any("names are used" in n for n in jl.notes)


def test_unnamed_groups_take_the_axes_of_the_given_sizes():
    truth = Layout.megatron(tp=4, pp=2, dp=2)
    configs = _pg_configs(truth, {})                     # pg_desc "undefined" everywhere (older torch)
    unknown = find_layout(configs, 16)
    assert unknown.layout is None and not unknown.axis_of_key
    assert any("4 ranks (consecutive)" in n and "2 ranks (stride 8)" in n for n in unknown.notes)
    jl = find_layout(configs, 16, flags={"tp": 4, "pp": 2})
    assert jl.layout == truth and AXES[jl.axis_of(group_key([4, 5, 6, 7]))] == "tp"
    assert AXES[jl.axis_of(group_key([1, 9]))] == "pp" and jl.source.startswith("--tp/--pp")


def test_partial_names_still_name_groups_and_stages():
    # only the pipeline groups are named (say a framework names some of its groups)
    truth = Layout.megatron(tp=2, pp=2, dp=2)
    jl = find_layout(_pg_configs(truth, {"pp": "PIPELINE_MODEL_PARALLEL_GROUP"}), 8)
    assert jl.layout is not None or jl.pp == 2
    assert [jl.stage(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_one_axis_spanning_the_world():
    jl = find_layout([[] for _ in range(8)], 8, flags={"tp": 8})      # Megatron TP=8 on 8 GPUs, no pg_config
    assert jl.world_axis == "tp"
    assert find_layout([[] for _ in range(8)], 8, flags={"tp": 4}).world_axis is None


def test_implausible_pg_config_is_dropped():
    assert compact_pg_config([{"pg_name": 1, "pg_desc": "mesh_tp", "ranks": [0, True, -3, 1 << 40, 1]},
                              {"ranks": "0,1"}, None]) == [["1", "mesh_tp", [0, 1]]]


def test_sizes_name_the_axis_of_collectives_that_name_no_group():
    """Old NCCL traces (no collective args, no pg_config): with --tp equal to the world size every
    collective ran in the TP group, and is attributed to it (Megatron TP=8 on 8 GPUs)."""
    import os

    from conftest import ROOT
    from diag.runinputs import RunInputs, open_run

    path = os.path.join(ROOT, "tests", "data", "dlrm_4_ranks_alltoall")
    before = open_run(path)
    assert {o.axis for o in before.comm.ops} == {"unknown"} and before.layout is None
    after = open_run(path, RunInputs(sizes={"tp": 4}))
    assert {o.axis for o in after.comm.ops} == {"tp"}
    assert after.layout == "tp4, from --tp (Megatron rank order)" and after.facts.tp == 4


def test_stage_layer_counts_split_as_megatron_does():
    """Megatron-LM's uneven split: the first and last stages their own counts, the rest shared evenly."""
    assert stage_layer_counts(8, 2) == [4, 4]
    assert stage_layer_counts(8, 2, first=6, last=2) == [6, 2]
    assert stage_layer_counts(8, 2, first=6) == [6, 2]              # the last stage takes the rest
    assert stage_layer_counts(10, 4, first=1, last=3) == [1, 3, 3, 3]
    assert stage_layer_counts(24, 4, first=3, last=3) == [3, 9, 9, 3]
    for bad in ((8, 2, 6, 3), (9, 2, 0, 0), (8, 4, 1, 2), (3, 4, 0, 0)):   # too many, uneven rest, no layer
        with pytest.raises(ValueError, match="do not split into"):
            stage_layer_counts(*bad)
