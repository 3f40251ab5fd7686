"""The output kept beside the sample traces is what diag prints on them today.

sample_traces/*/analyze.txt and recommend.txt are shown to users as diag's output on those traces
(sample_traces/README.md, the README). Each is compared, byte for byte, with `python -m diag
analyze|recommend DIR` run here on the same directory: a change to the analysis or its wording
that moves them fails here until `scripts/sample_outputs.sh` remakes them.
"""
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEPT = sorted(glob.glob(os.path.join(ROOT, "sample_traces", "*", "analyze.txt"))
              + glob.glob(os.path.join(ROOT, "sample_traces", "*", "recommend.txt")))


def test_there_are_kept_outputs():
    assert len(KEPT) >= 2, KEPT


@pytest.mark.parametrize("path", KEPT, ids=lambda p: os.path.relpath(p, ROOT))
def test_kept_output_is_todays(path):
    d, what = os.path.dirname(path), os.path.basename(path)[:-len(".txt")]
    p = subprocess.run([sys.executable, "-m", "diag", what, os.path.relpath(d, ROOT)], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    with open(path) as f:
        kept = f.read()
    assert p.stdout == kept, (f"{os.path.relpath(path, ROOT)} is not what `diag {what}` prints today: "
                              "remake it with scripts/sample_outputs.sh")
    assert not glob.glob(os.path.join(d, "*.diagsum"))      # no summaries left beside the traces
