"""The README's example output is real: every line it shows under a `$ diag analyze|recommend`
of a trace in the repository (tests/data, sample_traces) is in what that command prints today.
Lines with `...` are elisions, and commands that write files (`>`, `--timeline`) are left out."""
from __future__ import annotations

import os
import re
import shlex

import pytest
from click.testing import CliRunner

from diag.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = re.compile(r"^    \$ diag ((?:analyze|recommend) (?:tests/data|sample_traces)/.*)$")


def examples() -> list[tuple[str, list[str]]]:
    lines = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = COMMAND.match(lines[i])
        i += 1
        if not m:
            continue
        shown = []
        while i < len(lines) and (lines[i].startswith("    ") or not lines[i]) and not lines[i].startswith("    $"):
            shown.append(lines[i][4:])
            i += 1
        if ">" not in m.group(1) and "--timeline" not in m.group(1):
            out.append((m.group(1), [s for s in shown if s.strip() and "..." not in s]))
    return out


def _norm(s: str) -> str:
    return " ".join(s.split())


def test_the_readme_has_examples():
    assert len(examples()) >= 4


@pytest.mark.parametrize("command,shown", examples(), ids=[c for c, _ in examples()])
def test_readme_example_is_what_diag_prints(command, shown, monkeypatch):
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(main, shlex.split(command), catch_exceptions=False, terminal_width=80)
    assert r.exit_code == 0, r.output
    printed = _norm(r.output)
    missing = [s for s in shown if _norm(s) not in printed]
    assert not missing, f"README lines not printed by `diag {command}`:\n" + "\n".join(missing)
