"""Trace text is data in every renderer: one escaping helper per output kind.

Kernel, device, backend and file names, notes and schedules come from files anyone can write.
In Markdown they must not become HTML (`<img onerror=...>` in a device name) or markup (a
backtick in a file name ending its code span); in the terminal they must not become rich markup
(`[/bold]` in a kernel name crashed the text report) or control sequences (ESC moves the cursor,
rewrites the screen). JSON needs nothing: msgspec encodes every string.
"""
from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls: shown as \xNN, never sent to a terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# What CommonMark (and GFM tables) could read as markup or HTML inside a line of text.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>&|~])")
_BREAKS = re.compile(r"[\r\n\u2028\u2029]+")


def _hex(m: re.Match) -> str:
    return f"\\x{ord(m.group()):02x}"


def terminal(text: str) -> str:
    """A whole terminal report with control characters made visible (\\x1b, not ESC)."""
    return _CONTROL.sub(_hex, text)


def md_text(s) -> str:
    """One string of data as Markdown text: it reads as itself, on one line, nothing interpreted."""
    s = _BREAKS.sub(" ", terminal(str(s)))
    return _MD_SPECIAL.sub(r"\\\1", s)


def md_code(s, table: bool = False) -> str:
    """One string of data as a Markdown code span, whatever backticks it holds (CommonMark: a
    fence longer than any run inside, padded with spaces); in a GFM table cell `|` is escaped
    (GFM splits cells before it reads code spans)."""
    s = _BREAKS.sub(" ", terminal(str(s)))
    s = s.replace("|", "\\|") if table else s
    runs = [len(r) for r in re.findall(r"`+", s)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"
