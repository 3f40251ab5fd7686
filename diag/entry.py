"""The process's way in: the `diag` command and `python -m diag` (run). What runs before the
command line is parsed, so it imports neither click nor the analysis.
"""
from __future__ import annotations

import atexit
import os
import sys


class _OneBlasThread:
    """The import finder one_blas_thread puts first in sys.meta_path: it loads numpy (the top
    module only) with OPENBLAS_NUM_THREADS=1 in the environment, then takes itself out."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "numpy":
            return None
        from importlib.machinery import PathFinder

        sys.meta_path.remove(_OneBlasThread)           # once, and never for numpy's own submodules
        spec = PathFinder.find_spec(name, path)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            load = spec.loader.exec_module

            def exec_module(module):
                os.environ["OPENBLAS_NUM_THREADS"] = "1"
                try:
                    load(module)
                finally:
                    os.environ.pop("OPENBLAS_NUM_THREADS", None)

            spec.loader.exec_module = exec_module
        return spec


def one_blas_thread() -> None:
    """numpy loaded, when it is, with OpenBLAS held to one thread. diag multiplies no matrices,
    but OpenBLAS starts a thread per core as numpy loads it, and they spin for a while: on two
    cores ~0.05 CPU s of a 0.2 s `diag analyze`, beside the thread that reads the trace ahead
    (more threads, each spinning, on a bigger machine). OpenBLAS reads OPENBLAS_NUM_THREADS once,
    when it is loaded, so the variable is set for numpy's import alone: no process diag starts
    (the trainer under `diag tune`, whose torch may use OpenBLAS) inherits it. A variable the user
    set, or a numpy already imported, is left as it is; called again, it changes nothing."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ or _OneBlasThread in sys.meta_path:
        return
    sys.meta_path.insert(0, _OneBlasThread)


def read_ahead(argv: list[str]) -> None:
    """`diag analyze FILE ...`: FILE read, and its events decoded in forked workers, from before
    click and the command's modules are imported (~0.01 s of a 0.17 s analysis of a 10 MB trace
    that the workers now decode in, and that the process still imports after the fork). FILE is
    argv[2] when that is no option: `analyze` takes one argument and nothing before it can take
    a value. Only a regular file with no summary beside it (trace.prefetch.single, with the
    defaults; the command reads ahead again with its options, a no-op for a file already read).
    Should click then refuse the command line, the workers are cancelled at exit (chunks._cancel)
    and what was read is dropped. The bytes are kept to the end (prefetch.KEEP_TO_EXIT): this
    one-shot process ends with os._exit (run), and freeing them is ~3 ms of a 50 MB trace."""
    if len(argv) > 2 and argv[1] == "analyze" and not argv[2].startswith("-") and os.path.isfile(argv[2]):
        from .trace import prefetch

        prefetch.KEEP_TO_EXIT = True
        prefetch.single(argv[2])


def run() -> None:
    """The `diag` command (and `python -m diag`): read_ahead, main, then the process ends
    without the interpreter's teardown, as mypy's hard_exit does. The exit functions run and the
    standard streams are flushed as at a normal exit; what is skipped is freeing every object and
    module one by one (~0.02 s after a 0.35 s `diag analyze` of a 50 MB trace). An exception
    other than an exit leaves the usual way, with its traceback. Tests call cli.main, which
    returns."""
    one_blas_thread()
    read_ahead(sys.argv)
    from .cli import main

    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)       # as the interpreter prints sys.exit("message")
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):      # a closed pipe: Python exits 120 when it cannot flush
            code = code or 120
    os._exit(code)
