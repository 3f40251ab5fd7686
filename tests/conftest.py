import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

REAL_FOLDERS = sorted(d for d in os.listdir(DATA) if os.path.isdir(os.path.join(DATA, d)))


def analysis(path, *flags) -> dict:
    """`diag analyze PATH --format json FLAGS` through the CLI, parsed; it must exit 0."""
    import json

    from click.testing import CliRunner

    from diag.cli import main

    r = CliRunner().invoke(main, ["analyze", str(path), "--format", "json", *map(str, flags)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def comparable(d: dict) -> dict:
    """The diagnosis without what says how it was made: the notes, and where it was read from
    (the source, and the Flight Recorder dumps' paths: their names stay)."""
    d = dict(d)
    d.pop("notes")
    d.pop("source")
    if d.get("flight_recorder"):
        d["flight_recorder"] = {**d["flight_recorder"],
                                "files": [os.path.basename(f) for f in d["flight_recorder"]["files"]]}
    return d


@pytest.fixture(scope="session")
def native3d_run(tmp_path_factory):
    """native3d_run(schedule, *flags) -> the output folder of a run of tests/workloads/torch_native_3d.py
    (torchtitan-style, 8 processes, ~45 s on 2 cores), made on first use and kept for the session."""
    import subprocess

    runs = {}

    def run(schedule: str, *extra: str) -> str:
        key = (schedule, *extra)
        if key not in runs:
            folder = str(tmp_path_factory.mktemp(f"native3d_{schedule}"))
            cmd = [sys.executable, os.path.join(ROOT, "tests", "workloads", "torch_native_3d.py"), "--out", folder,
                   "--schedule", schedule, *extra]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
            assert p.returncode == 0, p.stderr[-3000:]
            runs[key] = folder
        return runs[key]
    return run


@pytest.fixture(params=REAL_FOLDERS)
def real_folder(request):
    return os.path.join(DATA, request.param)


def spread(samples) -> float:
    """Run-to-run noise of a set of timings: interquartile range over the median."""
    import numpy as np

    q25, q50, q75 = np.percentile(np.asarray(samples, float), [25, 50, 75])
    return float((q75 - q25) / q50) if q50 > 0 else float("inf")


class OtherWork:
    """`with OtherWork() as w: ...`, then `w.share`: the CPU the rest of the machine used while the
    block ran, as a share of all its cores (0.0 quiet, 1.0 every core busy with other work).

    The machine's busy time from /proc/stat (user, nice, system, irq, softirq, and steal: a
    hypervisor's other guests) less this process's and its waited-for descendants' own CPU time
    (getrusage). A steady load, such as two CPU burners beside a run, can leave a run's own step
    times even (a small spread) while shifting what the run measures; this sees it. `share` is
    None where /proc/stat is missing (not Linux): the caller's other noise measure stands alone."""

    share: float | None = None

    @staticmethod
    def _busy_s() -> float | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        import resource

        r = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        return sum(u.ru_utime + u.ru_stime for u in r)

    def __enter__(self):
        import time

        self._t, self._busy, self._own = time.monotonic(), self._busy_s(), self._own_s()
        return self

    def __exit__(self, *exc):
        import time

        wall, busy = time.monotonic() - self._t, self._busy_s()
        if busy is not None and self._busy is not None and wall > 0:
            other = (busy - self._busy) - (self._own_s() - self._own)
            self.share = max(0.0, other / (wall * (os.cpu_count() or 1)))
        return False


def timing_verdict(ok: bool, noise: float, limit: float, message: str) -> None:
    """A timing check on a machine that may be doing other work: pass when it holds; when it does
    not and the noise measured on the spot is past `limit`, the result is inconclusive (a skip
    that says the noise), not a failure; a failure only on a machine quiet enough to judge."""
    if ok:
        return
    if noise > limit:
        pytest.skip(f"inconclusive: {message}; the machine's noise measured now is {noise:.0%} "
                    f"(judged only under {limit:.0%})")
    pytest.fail(message)


def pytest_terminal_summary(terminalreporter):
    """Print the fuzzing counts in every run's summary (pytest -q captures the tests' own output)."""
    fuzz = sys.modules.get("test_fuzz_loader")
    if fuzz is not None and fuzz.COUNT["cases"]:
        c = fuzz.COUNT
        terminalreporter.write_line(f"fuzz: {c['cases']} malformed-trace cases: {c['diagnosed']} diagnosed, "
                                    f"{c['rejected']} rejected with a clear error, 0 other exceptions")
    atheris = sys.modules.get("test_fuzz_atheris")
    if atheris is not None and atheris.RESULT:
        r = atheris.RESULT
        terminalreporter.write_line(f"atheris: {r['runs']} coverage-guided inputs in {r['seconds']} s "
                                    f"({r['coverage']} edges, corpus {r['corpus']}): {r['diagnosed']} diagnosed, "
                                    f"{r['rejected']} rejected with a clear error, "
                                    "0 crashes, 0 hangs, 0 out-of-memory")


@pytest.fixture
def dev_null_kept():
    """For the tests that write to /dev/null through a command: if the command under test turned
    it into a regular file (as root, a temporary renamed over it did), it is made the device again
    before the test fails, so that a regression does not leave the machine without /dev/null."""
    import stat

    yield os.devnull
    if not stat.S_ISCHR(os.stat(os.devnull).st_mode) and os.geteuid() == 0:
        os.remove(os.devnull)
        os.mknod(os.devnull, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chmod(os.devnull, 0o666)
        pytest.fail("/dev/null was replaced by a regular file (made the device again)")
