"""Framework config files (diag.runconfig): torchtitan TOML, Megatron-LM command lines, launch
scripts and argument dumps, read into diag's keys; expected values worked out by hand from the
frameworks' own rules (in the comments)."""
from __future__ import annotations

import json

import pytest

from diag.analysis.throughput import gpt_params
from diag.runconfig import load_config
from diag.runconfig.values import schedule_name
from diag.trace import TraceError

TITAN_8B = """
# torchtitan Config.toml, as in torchtitan/models/llama3/train_configs
[job]
dump_folder = "./outputs"

[profiling]
enable_profiling = true
save_traces_folder = "profile_traces"

[model]
name = "llama3"
flavor = "8B"

[training]
local_batch_size = 8
global_batch_size = 256
seq_len = 8192
mixed_precision_param = "bfloat16"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 2
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_microbatch_size = 2
pipeline_parallel_layers_per_stage = 4
context_parallel_degree = 1

[activation_checkpoint]
mode = "selective"
"""


def write(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_torchtitan_toml_with_the_world_size(tmp_path):
    c = load_config(write(tmp_path, "llama3_8b.toml", TITAN_8B), world_size=64)
    # dp_shard -1: the ranks TP 2 x PP 2 leave of 64 = 16; the batch splits over 16 ranks, each
    # rank's local batch of 8 in pipeline micro-batches of 2, accumulated to the global 256:
    # 256 / (2 x 16) = 8 micro-batches (4 per local batch x 2 accumulation steps)
    assert (c["tp"], c["pp"], c["cp"], c["ep"], c["dp"], c["dp_shard"]) == (2, 2, 1, 1, 1, 16)
    assert (c["micro_batch_size"], c["global_batch_size"], c["num_micro_batches"]) == (2, 256, 8)
    # 32 layers in stages of 4 = 8 stages over 2 pipeline ranks: 4 model chunks per rank
    assert (c["pipeline_schedule"], c["virtual_pipeline_stages"]) == ("interleaved-1f1b", 4)
    # Llama 3 8B as Meta publishes it: SwiGLU of 14336, 8 key/value heads, vocabulary 128256
    assert (c["num_layers"], c["hidden_size"], c["ffn_hidden_size"]) == (32, 4096, 14336)
    assert (c["num_attention_heads"], c["num_query_groups"], c["vocab_size"], c["swiglu"]) == (32, 8, 128256, True)
    assert (c["seq_length"], c["dtype"], c["recompute_granularity"]) == (8192, "bf16", "selective")
    assert c["source"] == "torchtitan config llama3_8b.toml (llama3 8B)"
    # its TP plan runs torch's sequence parallelism whenever TP > 1 (SequenceParallel norms)
    assert (c["sequence_parallel"], c["sequence_parallel_kind"]) == (True, "dtensor")
    # the flavour's matmul parameters are Llama 3 8B's: 7,504,658,432 (see test_throughput)
    assert gpt_params(c["num_layers"], c["hidden_size"], c["vocab_size"], c["ffn_hidden_size"],
                      num_heads=c["num_attention_heads"], num_query_groups=c["num_query_groups"],
                      swiglu=c["swiglu"]) == 7_504_658_432


def test_torchtitan_without_the_world_size_leaves_the_rest_unknown(tmp_path):
    c = load_config(write(tmp_path, "llama3_8b.toml", TITAN_8B))
    assert "dp_shard" not in c and "world_size" not in c and "num_micro_batches" not in c
    assert c["global_batch_size"] == 256 and c["tp"] == 2


@pytest.mark.parametrize("flavor, want", [
    # Meta's published shapes: (layers, dim, heads, kv heads, MLP width)
    ("70B", (80, 8192, 64, 8, 28672)), ("405B", (126, 16384, 128, 8, 53248)),
    ("1B", (16, 2048, 32, 8, 8192)), ("3B", (28, 3072, 24, 8, 8192))])
def test_llama3_flavours(tmp_path, flavor, want):
    c = load_config(write(tmp_path, "c.toml", f'[model]\nname = "llama3"\nflavor = "{flavor}"\n'))
    assert (c["num_layers"], c["hidden_size"], c["num_attention_heads"], c["num_query_groups"],
            c["ffn_hidden_size"]) == want


def test_llama2_flavour_and_an_old_toml_layout(tmp_path):
    old = """[model]\nname = "llama"\nflavor = "7B"\n[training]\nbatch_size = 4\nseq_len = 4096
data_parallel_degree = 4\ntensor_parallel_degree = 2\n[experimental]\npipeline_parallel_degree = 1\n"""
    c = load_config(write(tmp_path, "old.toml", old))
    # Llama 2 7B: MLP 11008 (2/3 of 4 x 4096 = 10922, up to a multiple of 256), vocabulary 32000
    assert (c["hidden_size"], c["ffn_hidden_size"], c["vocab_size"], c["num_query_groups"]) == (4096, 11008, 32000, 32)
    # no global batch given: local x DP = 4 x 4; one micro-batch per step (no pipeline, no accumulation)
    assert (c["dp_shard"], c["tp"], c["world_size"], c["global_batch_size"], c["num_micro_batches"]) == (4, 2, 8, 16, 1)
    assert "pipeline_schedule" not in c


def test_unknown_flavour_is_said(tmp_path):
    c = load_config(write(tmp_path, "c.toml", '[model]\nname = "deepseek_v3"\nflavor = "16B"\n'))
    assert "hidden_size" not in c
    assert c["notes"] == ["model deepseek_v3 16B: not a flavour diag knows; give its shape (--num-layers, "
                          "--hidden-size, ...)"]


def test_wrong_type_names_the_file_and_key(tmp_path):
    p = write(tmp_path, "bad.toml", '[parallelism]\ntensor_parallel_degree = "two"\n')
    with pytest.raises(TraceError) as e:
        load_config(p)
    assert e.value.path == p and e.value.problem == "parallelism.tensor_parallel_degree: expected an integer, got 'two'"
    with pytest.raises(TraceError, match="not valid TOML"):
        load_config(write(tmp_path, "broken.toml", "[parallelism\n"))


LAUNCH = r"""#!/bin/bash
# Llama-3-8B-like pretraining on 4 nodes of 8 GPUs
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NNODES=4
TP=2
PP=4
HIDDEN=4096

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --master_addr ${MASTER_ADDR:-localhost}
)
MODEL_ARGS=(
    --num-layers 32
    --hidden-size $HIDDEN
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --swiglu
    --seq-length 8192   # tokens per sequence
)
TRAIN_ARGS="--micro-batch-size 1 --global-batch-size 512 --bf16 \
    --use-distributed-optimizer --overlap-grad-reduce"
PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size ${PP}
    --num-layers-per-virtual-pipeline-stage 4
    --sequence-parallel
)

CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} $TRAIN_ARGS \
    ${PARALLEL_ARGS[@]} \
    --vocab-size 128256 \
    --save $CHECKPOINT_PATH
"""


def test_megatron_launch_script(tmp_path):
    c = load_config(write(tmp_path, "train_llama3_8b.sh", LAUNCH))
    # world 8 x 4 = 32; DP = 32 / (TP 2 x PP 4) = 4; 512 / (1 x 4) = 128 micro-batches per step
    assert (c["world_size"], c["tp"], c["pp"], c["dp"], c["num_micro_batches"]) == (32, 2, 4, 4, 128)
    # 32 layers / PP 4 = 8 per rank, in chunks of 4: 2 virtual stages -> interleaved 1F1B
    assert (c["pipeline_schedule"], c["virtual_pipeline_stages"]) == ("interleaved-1f1b", 2)
    assert (c["hidden_size"], c["ffn_hidden_size"], c["num_query_groups"], c["swiglu"]) == (4096, 14336, 8, True)
    assert (c["seq_length"], c["vocab_size"], c["dtype"]) == (8192, 128256, "bf16")
    assert c["sequence_parallel"] and c["use_distributed_optimizer"] and c["sequence_parallel_kind"] == "megatron"
    # Megatron-LM's DDP: gradients are views of its grad buffer, no bucket copy (docs/memory.md)
    assert c["gradient_as_bucket_view"] is True and c["grads_set_to_none"] is False
    assert c["source"] == "Megatron-LM arguments train_llama3_8b.sh" and "notes" not in c


def test_megatron_command_line_text_and_its_defaults(tmp_path):
    cmd = ("python pretrain_gpt.py --tensor-model-parallel-size 8 --num-layers 32 --hidden-size 4096 "
           "--num-attention-heads 32 --seq-length 4096 --micro-batch-size 2 --global-batch-size 1024 --swiglu\n")
    c = load_config(write(tmp_path, "args.txt", cmd))
    # Megatron's SwiGLU default MLP: int(4 x 4096 x 2/3 / 64) x 64 = int(170.67) x 64 = 10880;
    # no --group-query-attention: multi-head (32 key/value heads); no world size: DP unknown
    assert (c["ffn_hidden_size"], c["num_query_groups"]) == (10880, 32)
    assert "dp" not in c and "num_micro_batches" not in c
    c = load_config(write(tmp_path, "args.txt", cmd), world_size=64)
    assert (c["dp"], c["num_micro_batches"]) == (8, 64)           # 64 / 8; 1024 / (2 x 8)


def test_megatron_uneven_split(tmp_path):
    """--decoder-first/last-pipeline-num-layers reach the facts (the memory model's and rebalance's split);
    without them there is no such key: an even share."""
    cmd = ("python pretrain_gpt.py --pipeline-model-parallel-size 4 --num-layers 30 --hidden-size 1024 "
           "--num-attention-heads 16 --decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 6\n")
    c = load_config(write(tmp_path, "args.txt", cmd))
    assert (c["decoder_first_pipeline_num_layers"], c["decoder_last_pipeline_num_layers"]) == (6, 6)
    even = load_config(write(tmp_path, "even.txt", cmd.split(" --decoder")[0] + "\n"))
    assert "decoder_first_pipeline_num_layers" not in even and "decoder_last_pipeline_num_layers" not in even


def test_megatron_values_not_in_the_script_are_said(tmp_path):
    c = load_config(write(tmp_path, "run.sh", "torchrun --nproc_per_node 8 --nnodes $SLURM_NNODES pretrain_gpt.py "
                                              "--num-layers $LAYERS --hidden-size 1024\n"))
    assert "world_size" not in c and "num_layers" not in c
    assert c["notes"] == ["not literal in the file, not used: --nnodes $SLURM_NNODES, --num-layers $LAYERS"]


def test_megatron_json_dump(tmp_path):
    dump = {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 1, "num_layers": 40,
            "hidden_size": 5120, "num_attention_heads": 40, "group_query_attention": False, "num_query_groups": 1,
            "ffn_hidden_size": 13824, "swiglu": True, "padded_vocab_size": 32000, "vocab_size": None,
            "seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 1024, "world_size": 64,
            "data_parallel_size": 16, "use_distributed_optimizer": True, "lr": 3e-4, "tokenizer_type": "Llama2"}
    c = load_config(write(tmp_path, "args.json", json.dumps(dump)))
    # no GQA flag: num_query_groups (1) is not used, heads = 40; 1024 / (1 x 16) = 64
    assert (c["tp"], c["dp"], c["num_query_groups"], c["vocab_size"], c["num_micro_batches"]) == (4, 16, 40, 32000, 64)
    with pytest.raises(TraceError, match="num_layers: expected an integer, got 'forty'"):
        load_config(write(tmp_path, "bad.json", json.dumps({**dump, "num_layers": "forty"})))
    with pytest.raises(TraceError, match="swiglu: expected true or false, got 3"):
        load_config(write(tmp_path, "bad.json", json.dumps({**dump, "swiglu": 3})))


def test_megatron_yaml_dump(tmp_path):
    pytest.importorskip("yaml")
    c = load_config(write(tmp_path, "args.yaml", "tensor_model_parallel_size: 2\nnum_layers: 24\nswiglu: false\n"))
    assert (c["tp"], c["num_layers"], c["swiglu"]) == (2, 24, False)


def test_a_file_with_nothing_to_use_is_refused(tmp_path):
    with pytest.raises(TraceError, match="no Megatron-LM arguments"):
        load_config(write(tmp_path, "notes.txt", "just some notes --verbose\n"))
    with pytest.raises(TraceError, match="cannot read the config file"):
        load_config(str(tmp_path / "missing.toml"))


@pytest.mark.parametrize("given, want", [
    ("1F1B", "1f1b"), ("GPipe", "gpipe"), ("Interleaved1F1B", "interleaved-1f1b"),
    ("ScheduleInterleaved1F1B", "interleaved-1f1b"), ("InterleavedZeroBubble", "zb1p"),
    ("ZBVZeroBubble", "zbv"), ("DualPipeV", "dualpipev"), ("LoopedBFS", "looped-bfs"), ("MySchedule", "myschedule")])
def test_schedule_names(given, want):
    assert schedule_name(given) == want
