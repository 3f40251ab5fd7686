"""Trace text is data in the text and Markdown renderers (issue #20, class 5), fuzzed with
hypothesis: hostile device, backend and kernel names and file names (HTML, rich markup,
backticks, control characters) end up in a report that shows them as they are and interprets
nothing. Markdown is checked by parsing the report with markdown-it (CommonMark + GFM tables): no
raw HTML, link or image token anywhere, the same emphasis as a report of harmless names, and each
name in the parsed text. The terminal report: no control character, the name verbatim."""
from __future__ import annotations

import json
import os
import re

from hypothesis import HealthCheck, given, settings, strategies as st
from markdown_it import MarkdownIt

from diag.analysis import diagnose
from diag.report import render
from diag.report.escape import terminal
from diag.report.text import render_text
from diag.trace import load_job
from kineto import TraceBuilder

COUNT = {"cases": 0}
PAYLOADS = ["<img src=x onerror=alert(1)>", "[/bold]", "[bold red]x[/]", "`", "``a``", "<script>x</script>",
            "**b** _i_ [l](http://x) ![i](y)", "&amp; &lt;", "| a | b |", "\x1b[2J\x1b[31m", ":smile:", "\\", "~~s~~",
            "<!-- c -->", "\u2028", "a\nb\r\n# h", "\x07\x00\x9b"]
hostile = st.one_of(st.sampled_from(PAYLOADS),
                    st.text(alphabet=st.sampled_from(list("<>&`[]/*_|\\~!#()-:\n\x1b\x00 ab")) , min_size=1, max_size=24),
                    st.lists(st.sampled_from(PAYLOADS), min_size=2, max_size=4).map("x".join))
MD = MarkdownIt("commonmark").enable("table")


def _job(folder, device: str, backend: str, kernel: str, fname: str):
    b = TraceBuilder(backend=backend).step(1, 0, 100).step(2, 100, 100)
    b.kernel(kernel, 10, 30).kernel(kernel, 110, 30)
    doc = b.doc()
    doc["deviceProperties"][0]["name"] = device
    folder.mkdir()
    (folder / f"{fname}.pt.trace.json").write_text(json.dumps(doc))
    (folder / f"{fname}-bad.pt.trace.json").write_text("{")            # its name is in the problems
    return diagnose(load_job(str(folder)))


def _inline_texts(tokens) -> list[str]:
    return ["".join(c.content for c in t.children or []) for t in tokens if t.type == "inline"]


def _kinds(tokens) -> list[str]:
    return [c.type for t in tokens for c in ([t] + list(t.children or []))]


def _shown(s: str) -> str:
    """What a one-line Markdown text shows of s (escape.md_text: breaks as spaces, controls as \\xNN)."""
    return re.sub(r"[\r\n\u2028\u2029]+", " ", terminal(s)).strip()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile, hostile, hostile)
def test_hostile_names_are_shown_never_interpreted(tmp_path_factory, device, kernel, fname):
    tmp = tmp_path_factory.mktemp("esc")
    fname = fname.replace("/", "_").replace("\x00", "_").strip() or "x"
    COUNT["cases"] += 1
    d = _job(tmp / "run", device, device, kernel, fname)
    benign = _job(tmp / "benign", "GPU", "nccl", "gemm", "rank0")

    md = MD.parse(render(d, "markdown"))
    kinds = _kinds(md)
    assert not {"html_inline", "html_block", "link_open", "image"} & set(kinds), kinds
    base = _kinds(MD.parse(render(benign, "markdown")))
    for k in ("strong_open", "em_open", "heading_open", "table_open", "bullet_list_open"):
        assert kinds.count(k) == base.count(k), k
    texts = "\n".join(_inline_texts(md))
    assert _shown(device) in texts
    assert _shown(os.path.join(str(tmp), "run", f"{fname}-bad.pt.trace.json")) in texts

    text = render_text(d, width=100_000)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text)
    if not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", device):
        assert device in text


def test_zz_escaping_counts():
    print(f"\nescaping fuzz: {COUNT['cases']} cases of hostile names through the text and Markdown reports")
    assert COUNT["cases"] >= 60
