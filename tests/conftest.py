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
    """The diagnosis without what says how it was made: the notes, and where it was read from."""
    d = dict(d)
    d.pop("notes")
    d.pop("source")
    return d


@pytest.fixture(params=REAL_FOLDERS)
def real_folder(request):
    return os.path.join(DATA, request.param)


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
