"""diag_run.json as one typed, versioned schema (diag.runmeta): validated on read with an error that
names the file and the field, never a traceback or a run half-analysed; the device table, not the
record, is the first source of peak FLOP/s; the record's facts reach the analysis typed."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from diag import runmeta
from diag.analysis import diagnose
from diag.runinputs import RunInputs, open_run
from diag.trace.job import load_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "sample_traces", "pp2_m2")


def _copy(tmp_path, **changes):
    """The sample run with its diag_run.json edited (a key set to ... removes it)."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    meta = json.loads((run / "diag_run.json").read_text())
    for k, v in changes.items():
        if v is ...:
            meta.pop(k, None)
        else:
            meta[k] = v
    (run / "diag_run.json").write_text(json.dumps(meta))
    return run


def test_every_sample_record_reads_and_round_trips():
    for name in sorted(os.listdir(os.path.join(ROOT, "sample_traces"))):
        p = os.path.join(ROOT, "sample_traces", name, "diag_run.json")
        if not os.path.exists(p):
            continue
        with open(p, "rb") as f:
            raw = f.read()
        facts = runmeta.decode(raw)
        written = json.loads(runmeta.encode(facts))
        for k, v in json.loads(raw).items():          # every key the producer wrote survives, typed
            want = [list(x) for x in v] if k == "layout" and v else v
            got = written[k]
            if isinstance(v, dict):                     # a field added since the sample was made: unset
                assert all(got[x] is None for x in set(got) - set(v)), (k, got)
                got = {x: got[x] for x in v}
            assert got == want if k != "schema_version" else got in (1, 2), k


@pytest.mark.parametrize("key,value,field", [
    ("tp", [2], "$.tp"),                              # a list where a number belongs
    ("global_batch_size", "4", "$.global_batch_size"),  # a number written as a string
    ("world_size", 10 ** 12, "$.world_size"),         # a size that would drive work per claimed rank
    ("num_layers", -3, "$.num_layers"),
    ("profile", {"enabled": "yes"}, "$.profile.enabled"),
])
def test_a_bad_field_is_named_and_the_traces_are_still_analysed(tmp_path, key, value, field):
    run = _copy(tmp_path, **{key: value})
    job = load_job(str(run))
    assert len(job.ranks) == 2 and job.run_meta is None
    (problem,) = job.problems
    assert problem.path.endswith("diag_run.json") and field in problem.problem, problem.problem
    d = diagnose(job)
    assert d.run is None and d.facts.num_layers is None     # nothing from the bad file is used
    assert d.ranks[0].breakdown.span_s > 0
    with pytest.raises(Exception) as e:                     # --strict: the first problem is the error
        load_job(str(run), strict=True)
    assert "diag_run.json" in str(e.value) and field in str(e.value)


@pytest.mark.parametrize("content,words", [
    (b"[1, 2]", "expected a JSON object"),
    (b'{"schema_version": 99, "tp": 2}', "schema_version 99"),
    (b'{"tp": 2}', "schema_version None"),
    (b'{"schema_version": 2, "tp": 2', "not JSON"),
])
def test_records_that_are_not_a_run_record(tmp_path, content, words):
    run = _copy(tmp_path)
    (run / "diag_run.json").write_bytes(content)
    job = load_job(str(run))
    assert len(job.ranks) == 2 and job.run_meta is None
    assert words in job.problems[0].problem


def test_cli_names_the_file_and_the_field_in_one_line(tmp_path):
    run = _copy(tmp_path, tp=[2])
    p = subprocess.run([sys.executable, "-m", "diag.cli", "analyze", str(run), "--strict"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "diag_run.json" in line and "$.tp" in line


def test_a_bad_flag_value_is_an_error_naming_its_source(tmp_path):
    with pytest.raises(ValueError, match=r"the flags: .*\$\.global_batch_size"):
        open_run(SAMPLE, RunInputs(shape={"global_batch_size": -1}))


def test_facts_merge_in_order_and_stay_typed():
    record = runmeta.convert({"tp": 2, "seq_length": 64, "dtype": "bf16"}, "diag_run.json")
    config = runmeta.convert({"seq_length": 128, "notes": ["not a fact"], "model": "llama3 8B"}, "--config")
    flags = runmeta.convert({"seq_length": 256}, "the flags")
    got = runmeta.merged(record, config, flags)
    assert (got.tp, got.seq_length, got.dtype, got.model) == (2, 256, "bf16", "llama3 8B")
    assert runmeta.merged(record, None).seq_length == 64


def test_the_device_table_wins_over_a_record_that_says_sxm_for_a_pcie_part(tmp_path):
    """An H100 PCIe run whose record carries the SXM peak (989.5 TF): the table's 756.5 TF is used,
    so MFU is not 24% low; the record's peak is used only for a device the table does not know."""
    from types import SimpleNamespace

    from diag.analysis.rates import throughput
    shape = dict(global_batch_size=8, seq_length=1024, num_layers=4, hidden_size=1024, vocab_size=32000)
    meta = runmeta.convert({**shape, "dtype": "bf16", "peak_flops": 989.5e12}, "diag_run.json")
    t = throughput([SimpleNamespace(step_time_s=1.0, device="NVIDIA H100 PCIe")], meta, 8)
    assert t.peak_flops == pytest.approx(756.5e12) and t.peak_source.startswith("device table: NVIDIA H100 PCIe")
    t = throughput([SimpleNamespace(step_time_s=1.0, device="Some Future Accelerator")], meta, 8)
    assert t.peak_flops == pytest.approx(989.5e12) and t.peak_source == "diag_run.json"
    assert t.mfu == pytest.approx(t.model_flops_per_step / (1.0 * 8 * 989.5e12))


def test_write_is_atomic_and_follows_no_planted_temporary(tmp_path):
    path = tmp_path / "diag_run.json"
    runmeta.write(str(path), runmeta.RunFacts(tp=2))
    assert runmeta.decode(path.read_bytes()).tp == 2
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, f"{path}.{os.getpid()}.tmp")        # the old predictable name, planted
    runmeta.write(str(path), runmeta.RunFacts(tp=4))        # safeio.atomic_write: an unpredictable one
    assert victim.read_text() == "keep" and runmeta.decode(path.read_bytes()).tp == 4
    assert sorted(os.listdir(tmp_path)) == sorted(["diag_run.json", "victim", f"diag_run.json.{os.getpid()}.tmp"])
