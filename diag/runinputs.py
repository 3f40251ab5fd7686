"""One way in: a run is opened with everything known about it, the same way by every command.

`diag analyze`, `recommend`, `compare`, `export` and the dashboard all take the same inputs
(the path, the layout's sizes, a framework config file, the model and batch shape, the link and
device peaks, a `diag bench` curve) through `run_options`, and open the run with `open_run`, so
a flag that works on one works on all and a run is diagnosed (and advised) once.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import field
from typing import Callable, Optional

import click

from .record import record

# Megatron-LM's names for the sizes of the layout (layoutfind.SIZE_KEYS), the short ones beside them.
SIZE_FLAGS = (("tp", "--tensor-model-parallel-size", "TP size"),
              ("pp", "--pipeline-model-parallel-size", "PP size"),
              ("cp", "--context-parallel-size", "context-parallel size"),
              ("ep", "--expert-model-parallel-size", "expert-parallel size"),
              ("dp_shard", "--data-parallel-shard-size", "sharded data-parallel (FSDP / ZeRO-3) size"))
# Run facts in Megatron-LM's names: for tokens/s, MFU and the ideal bubble.
SHAPE_FLAGS = (("global_batch_size", "Sequences per step (for tokens/s, MFU)."),
               ("micro_batch_size", "Sequences per micro-batch."),
               ("seq_length", "Tokens per sequence."),
               ("num_layers", "Transformer layers (for model FLOPs)."),
               ("hidden_size", "Hidden size (for model FLOPs)."),
               ("ffn_hidden_size", "MLP hidden size (default 4 x hidden)."),
               ("num_attention_heads", "Attention heads."),
               ("num_query_groups", "Key/value heads (grouped-query attention)."),
               ("vocab_size", "Vocabulary size (for model FLOPs)."),
               ("num_micro_batches", "Micro-batches per step (for the ideal bubble)."),
               ("virtual_pipeline_stages", "Model chunks per pipeline rank (interleaved schedules)."),
               ("decoder_first_pipeline_num_layers", "Layers of the first pipeline stage, where it has its own "
                                                     "count (Megatron-LM's uneven split; default: an even share)."),
               ("decoder_last_pipeline_num_layers", "Layers of the last pipeline stage, where it has its own count."),
               ("host_cpus", "CPU cores a host gives its ranks (CPU runs; with --ranks-per-host and "
                             "--threads-per-rank: whether gloo's threads have a core of their own)."),
               ("ranks_per_host", "Ranks on one host (CPU runs)."),
               ("threads_per_rank", "torch's intra-op threads per rank (CPU runs)."))


@record(frozen=True)
class RunInputs:
    """What the user says about a run, beside its traces."""

    sizes: dict = field(default_factory=dict)      # tp, pp, cp, ep, dp_shard
    shape: dict = field(default_factory=dict)      # SHAPE_FLAGS names, swiglu, pipeline_schedule, ...
    config: Optional[str] = None                   # a Megatron-LM arguments file or a torchtitan TOML
    iteration: Optional[int] = None                # torchtitan's profile_traces/iteration_N to take
    strict: bool = False
    top: int = 10
    use_summaries: bool = True
    link_gbps: Optional[float] = None
    peak_tflops: Optional[float] = None
    bench: Optional[str] = None


    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: Optional[str]) -> "RunInputs":
        """RunInputs from to_json's text (how `diag dashboard` hands its flags to the app)."""
        if not text:
            return cls()
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})


BENCH_NEXT_TO_TRACES = "diag_bench.json"


def files_read(path: str, inputs: Optional[RunInputs] = None) -> list[str]:
    """Every file the analysis of the run at `path` (a folder or one trace) reads: `path`, the
    traces and summaries analysis.collect picks (in subfolders too), diag_run.json and
    diag_bench.json beside them, and the --config and --bench files. What a command must never
    write over, and what the dashboard confines to its root: one list for both."""
    from .analysis.collect import items_of
    from .trace.errors import TraceError
    from .trace.job import RUN_METADATA

    files = [path] + ([inputs.config, inputs.bench] if inputs else [])
    try:
        items, meta_dir, _ = items_of(path, inputs.iteration if inputs else None)
    except (TraceError, OSError):
        return [f for f in files if f]                 # the analysis says what is wrong with `path`
    files += [f for it in items for f in (it.trace, it.summary)]
    near = {meta_dir, path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))}
    files += [os.path.join(d, n) for d in sorted(near) for n in (RUN_METADATA, BENCH_NEXT_TO_TRACES)
              if os.path.lexists(os.path.join(d, n))]
    if not os.path.isdir(path):
        if os.path.lexists(path + ".diagsum"):
            files.append(path + ".diagsum")
        files += _run_beside(path)
    return list(dict.fromkeys(f for f in files if f))


def _run_beside(path: str) -> list[str]:
    """The files of the run a single trace belongs to (its folder's traces, summaries, run files
    and Flight Recorder dumps): not read for this trace, but a report over them destroys that run."""
    from .trace.flightrec import dump_files

    folder = os.path.dirname(os.path.abspath(path))
    try:
        return files_read(folder)[1:] + dump_files(folder)
    except (OSError, ValueError):
        return []


def _bench_for(path: str, given: Optional[str], problems: Optional[list] = None):
    """The busbw curve given with --bench (a bad one: TraceError, the command's input), or the
    diag_bench.json found next to the traces: a bad one there is a problem in `problems` (the
    file and what is wrong), the run analysed without a curve, as a bad rank file is."""
    from .analysis.benchcurve import load_bench
    from .trace.errors import TraceError

    if given:
        return load_bench(given)
    beside = os.path.join(path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)),
                          BENCH_NEXT_TO_TRACES)
    if not os.path.lexists(beside):
        return None
    try:
        return load_bench(beside)
    except TraceError as e:
        if problems is None:
            raise
        from .analysis.results import Problem
        problems.append(Problem(e.path, e.problem))
        return None


def open_run(path: str, inputs: RunInputs = RunInputs(), progress: Optional[Callable] = None):
    """The Diagnosis of the run at `path` (recommendations included). Raises TraceError (a file
    and its problem) or ValueError (inputs that contradict each other or the traces)."""
    return open_run_job(path, inputs, progress)[0]


def prefetch_trace(path: str, inputs: RunInputs = RunInputs()) -> None:
    """Start reading (and inflating) a single trace file in a thread while numpy and the decoder
    are imported, then decoding its events in forked workers while the analysis is imported
    (trace.prefetch), unless its summary is what will be read. Call it first: the file is
    opened before anything heavy is imported. In a directory the run's first trace file, the
    first the loader reads, is read ahead the same way where its files are loaded in this process
    (not where they go to worker processes, which must not inherit a read in flight)."""
    from .trace import prefetch
    from .trace.discover import find
    from .trace.errors import TraceError
    from .trace.read import file_size, in_one_process

    if os.path.isdir(path):
        try:
            found = find(path, inputs.iteration)
        except (TraceError, OSError):
            return                                    # the loader reports it
        ranks = found.ranks()                         # as the loader reads them (analysis.collect.items_of)
        if not ranks or ranks[0][0] is None or not in_one_process([file_size(t) if t else 0 for t, _ in ranks]):
            return
        path, summary = ranks[0]
        if inputs.use_summaries and summary is not None:
            return
    prefetch.single(path, inputs.use_summaries)


def open_run_job(path: str, inputs: RunInputs = RunInputs(), progress: Optional[Callable] = None):
    """open_run's Diagnosis, and the Job it was made from: its ranks' summaries, their comms as
    diagnosed (axes, groups, match ids), for a renderer that draws the events (report.timeline)."""
    prefetch_trace(path, inputs)
    # Imported before the load, while the workers prefetch_trace forked decode the trace: after it,
    # the ~0.03 s of the recommender's imports would be the only work left, on one core.
    from .advise.recommend import with_advice     # after the analysis in the layers: analysis never imports it
    from .analysis import diagnose
    from .analysis.collect import load_summaries
    from .trace.errors import TraceError
    from .trace.flightrec import dump_files

    # Flight Recorder dumps, alone or beside traces; their groups named by the layout given as for the
    # traces. Their analysis is imported only where there are some (~5 ms of imports otherwise).
    if dump_files(path):
        from .analysis.flightrec import dumps_only, flight_record

        fr, fr_problems = flight_record(path, inputs.strict, inputs.sizes, inputs.config)
    else:
        fr, fr_problems = None, []
    try:
        job = load_summaries(path, progress=progress, strict=inputs.strict, top_n=inputs.top,
                             use_summaries=inputs.use_summaries, iteration=inputs.iteration)
    except TraceError as e:
        # the dumps alone are analysed where there is no trace; with --strict a bad file still fails
        bad_file = os.path.abspath(e.path) != os.path.abspath(path)
        if (fr is None and not fr_problems) or (inputs.strict and bad_file):
            raise
        from .trace.job import Job
        return dumps_only(path, fr, fr_problems), Job(path, [])     # no trace: no events to draw
    config = None
    if inputs.config:                      # after the traces: "the rest of the ranks" needs the world size
        from .runconfig import load_config
        config = load_config(inputs.config, world_size=job.world_size)
    bench_problems: list = []
    bench = _bench_for(path, inputs.bench, None if inputs.strict else bench_problems)
    d = diagnose(job, top_n=inputs.top, link_gbps=inputs.link_gbps, peak_tflops=inputs.peak_tflops,
                 shape=inputs.shape, bench=bench, sizes=inputs.sizes, config=config)
    d.problems = d.problems + bench_problems
    if fr is not None and not fr.layout and d.layout:
        # the dumps name no axis, the traces do: one layout for both (layoutfind, as diagnose resolved it)
        from .analysis.diagnose import job_layout, summaries_of
        grid = job_layout(job, summaries_of(job, inputs.top), inputs.sizes, config)
        fr, fr_problems = flight_record(path, inputs.strict, inputs.sizes, inputs.config, grid)
    d.flight_recorder, d.problems = fr, d.problems + fr_problems
    return with_advice(d), job


def run_options(f):
    """The click options of RunInputs, handed to the command as one `inputs` argument."""
    opts = [
        click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
                     help="The job's Megatron-LM arguments (command line, script or JSON dump) or torchtitan "
                          "TOML: layout, batch and model shape."),
        click.option("--iteration", type=click.IntRange(0), default=None,
                     help="Which profile_traces/iteration_N folder to analyse (default: the latest)."),
        click.option("--strict", is_flag=True, help="Fail on the first unreadable rank file instead of reporting it."),
        click.option("--top", default=10, show_default=True, type=click.IntRange(1, 1000), help="Kernels to list per rank."),
        click.option("--no-summaries", is_flag=True,
                     help="Analyse every trace even where `diag summarize` left a summary (*.diagsum) of it."),
        click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Link peak in GB/s for busbw efficiency (default: the device's NVLink/PCIe table)."),
        click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Peak dense TFLOP/s per device for MFU (default: diag_run.json or the device table)."),
        click.option("--bench", "bench_path", type=click.Path(dir_okay=False), default=None,
                     help="A `diag bench` result to set each collective against (default: diag_bench.json "
                          "next to the traces)."),
        click.option("--swiglu/--no-swiglu", default=None, help="The MLP is SwiGLU (three matrices)."),
        click.option("--gradient-as-bucket-view/--no-gradient-as-bucket-view", default=None,
                     help="Replicated DP's gradients are views of its buckets (DDP's gradient_as_bucket_view=True, "
                          "Megatron-LM's DDP), or not: its buckets are one more copy of them (DDP's default). For "
                          "the memory model (default: diag_run.json or --config, else unknown and not counted)."),
        click.option("--grads-set-to-none/--no-grads-set-to-none", default=None,
                     help="The run sets its gradients to None between steps (torch's zero_grad() default), or keeps "
                          "them allocated (Megatron-LM's grad buffer). For the memory model: none are alive before "
                          "a step's first backward (default: diag_run.json or --config, else unknown and counted)."),
        click.option("--memory-per-gpu", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Device memory in GiB, to check that a recommendation fits (default: the device table)."),
        click.option("--pipeline-schedule", type=click.Choice(["gpipe", "1f1b", "interleaved-1f1b", "zb1p", "zbv",
                                                               "dualpipev"]), default=None,
                     help="The pipeline schedule (default: read from the trace where it shows it)."),
    ]
    for key, long, what in SIZE_FLAGS:
        short = "--" + key.replace("_", "-")
        opts.append(click.option(short, long, key, type=click.IntRange(1), default=None,
                                 help=f"{what} (default: the traces' process-group names, --config or diag_run.json)."))
    for key, what in SHAPE_FLAGS:
        opts.append(click.option("--" + key.replace("_", "-"), key, type=click.IntRange(1), default=None, help=what))

    @functools.wraps(f)
    def wrapper(*args, **kw):
        sizes = {k: kw.pop(k) for k, _, _ in SIZE_FLAGS}
        shape = {k: kw.pop(k) for k, _ in SHAPE_FLAGS}
        shape["swiglu"], shape["pipeline_schedule"] = kw.pop("swiglu"), kw.pop("pipeline_schedule")
        shape["gradient_as_bucket_view"] = kw.pop("gradient_as_bucket_view")
        shape["grads_set_to_none"] = kw.pop("grads_set_to_none")
        gib = kw.pop("memory_per_gpu")
        shape["memory_per_gpu_bytes"] = int(gib * (1 << 30)) if gib else None
        kw["inputs"] = RunInputs(
            sizes={k: v for k, v in sizes.items() if v is not None},
            shape={k: v for k, v in shape.items() if v is not None},
            config=kw.pop("config"), iteration=kw.pop("iteration"), strict=kw.pop("strict"), top=kw.pop("top"),
            use_summaries=not kw.pop("no_summaries"), link_gbps=kw.pop("link_gbps"),
            peak_tflops=kw.pop("peak_tflops"), bench=kw.pop("bench_path"))
        return f(*args, **kw)

    for o in reversed(opts):
        wrapper = o(wrapper)
    return wrapper
