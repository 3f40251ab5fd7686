"""Which GPU a rank takes (instrumented_trainer.launch.gpu_for): its local rank, or with more
local ranks than GPUs, local rank mod GPUs and an NCCL host identity of its own (NCCL refuses
two ranks of one host on one GPU). The sharing itself ran on an H100 and an H200 (sample_traces/h200_*)."""
import pytest

from instrumented_trainer.launch import gpu_for


@pytest.fixture
def env(monkeypatch):
    for k in ("NCCL_HOSTID", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_one_gpu_a_rank_leaves_nccl_alone(env):
    import os
    env.setenv("LOCAL_WORLD_SIZE", "4")
    env.setenv("WORLD_SIZE", "4")
    assert [gpu_for(r, 4) for r in range(4)] == [0, 1, 2, 3]
    assert "NCCL_HOSTID" not in os.environ and "NCCL_SOCKET_IFNAME" not in os.environ


def test_more_ranks_than_gpus_share_with_a_host_identity_each(env, capsys):
    import os
    env.setenv("LOCAL_WORLD_SIZE", "4")
    env.setenv("WORLD_SIZE", "4")
    ids = []
    for r in range(4):
        env.delenv("NCCL_HOSTID", raising=False)
        assert gpu_for(r, 2) == r % 2
        ids.append(os.environ["NCCL_HOSTID"])
    assert len(set(ids)) == 4 and os.environ["NCCL_SOCKET_IFNAME"] == "lo"
    assert "4 ranks share 2 GPU(s)" in capsys.readouterr().err      # once, from local rank 0


def test_a_users_nccl_settings_are_kept(env):
    import os
    env.setenv("LOCAL_WORLD_SIZE", "2")
    env.setenv("WORLD_SIZE", "4")          # two nodes: loopback would not reach the other
    env.setenv("NCCL_HOSTID", "mine")
    assert gpu_for(1, 1) == 0
    assert os.environ["NCCL_HOSTID"] == "mine" and "NCCL_SOCKET_IFNAME" not in os.environ
