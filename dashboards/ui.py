"""Streamlit glue shared by the dashboard's pages: opening runs, the sidebar, number formats.

The pages only render: everything they show comes from a LoadedRun (a Diagnosis and a
PipelineGantt) that this module opens through diag_runs, which enforces the root.
"""
from __future__ import annotations

import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Optional

import streamlit as st
from streamlit import runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

from diag.trace.errors import TraceError
from run_inputs import sidebar_inputs
from diag_runs import (LoadedRun, Settings, drop_orphan_uploads, drop_upload, list_runs, load_run, safe_path,
                       save_uploads)

UPLOAD_LABEL = "upload"


@st.cache_resource
def _cache() -> OrderedDict:
    return OrderedDict()


def settings() -> Settings:
    return Settings.from_env()


def open_run(name: str, label: Optional[str] = None, root=None, inputs=None) -> Optional[LoadedRun]:
    """Load a run by name under the root, with a progress bar, opened with `inputs` (RunInputs;
    default `diag dashboard`'s flags); None (and an error shown) if refused."""
    s = settings()
    path = safe_path(root or s.root, name)
    if path is None:
        st.error(f"Refused: {md(repr(name))} is not a trace file or run folder under {md(root or s.root)}.")
        return None
    label = label or name
    bar = st.progress(0.0, text=f"loading {md(label)}")

    def progress(file: str, done: int, total: int) -> None:
        bar.progress(done / total if total else 1.0, text=f"loading {md(label)}: {done}/{total} {md(os.path.basename(file))}")

    try:
        return load_run(path, label, _cache(), progress, inputs)
    except (TraceError, ValueError, OSError) as e:
        st.error(f"Cannot analyse {md(label)}: {md(e)}")
        return None
    finally:
        bar.empty()


def _session_id() -> Optional[str]:
    ctx = get_script_run_ctx()
    return ctx.session_id if ctx else None


def _drop_ended_sessions_uploads() -> None:
    """Uploads of sessions the server no longer has (closed tabs) go; Streamlit tells no one."""
    if runtime.exists():
        drop_orphan_uploads(runtime.get_instance().is_active_session)


def _uploaded_run(s: Settings, inputs) -> Optional[LoadedRun]:
    files = st.sidebar.file_uploader(f"…or upload trace files (max {s.max_upload_mb} MB)",
                                     type=["json", "gz"], accept_multiple_files=True, key="upload")
    held = st.session_state.get("upload_dir")
    if not files:
        drop_upload(st.session_state.pop("upload_dir", None))
        st.session_state.pop("upload_id", None)
        return None
    ident = tuple((f.name, f.size, f.file_id) for f in files)
    # a session back after its folder went (reconnected late) writes its files again
    if st.session_state.get("upload_id") != ident or (held and not os.path.isdir(held)):
        drop_upload(held)
        folder, problems = save_uploads(files, s.max_upload_mb, owner=_session_id())
        for p in problems:
            st.sidebar.error(md(p))
        st.session_state["upload_id"], st.session_state["upload_dir"] = ident, folder and str(folder)
    held = st.session_state.get("upload_dir")
    return open_run(held, UPLOAD_LABEL, root=Path(held), inputs=inputs) if held else None


def _picked(key: str) -> None:
    st.query_params["run"] = st.session_state[key]


def sidebar_run() -> Optional[LoadedRun]:
    """The run the pages show: an upload if there is one, else ?run=, else the one picked before."""
    s = settings()
    _drop_ended_sessions_uploads()
    runs = list_runs(s.root)
    name = st.query_params.get("run") or st.session_state.get("run_name") or s.run or (runs[0] if runs else "")
    # The picker shows the run the page shows, on every page. It is a new widget for each run (its
    # key names the run) made with that run's index: a value pushed into one widget through
    # session_state could lose a race with the browser's own, which then showed the first run
    # (seen under load in tests/test_dashboard_browser.py).
    key = f"run_pick:{name}"
    st.sidebar.caption(f"Runs under {md(s.root)}")
    st.sidebar.selectbox("Run", runs, index=runs.index(name) if name in runs else None, key=key,
                         on_change=_picked, args=(key,), placeholder="pick a run")
    inputs = sidebar_inputs(s.root)
    uploaded = _uploaded_run(s, inputs)
    if uploaded:
        st.sidebar.info("Showing the uploaded traces; remove them to go back to the picked run.")
        return uploaded
    if not name:
        st.info(f"No runs under {md(s.root)}: start `diag dashboard` on a folder of traces, or upload some.")
        return None
    st.session_state["run_name"] = name
    st.query_params["run"] = name
    return open_run(name, inputs=inputs)


def current() -> LoadedRun:
    """The LoadedRun app.py opened; stops the page when there is none."""
    run = st.session_state.get("run")
    if run is None:
        st.stop()
    return run


# Every ASCII punctuation mark is backslash-escapable in CommonMark; escaping them all keeps
# Markdown (images, links, HTML, code spans), Streamlit's :color[] directives and KaTeX's $ out.
_MD_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")
# GFM links bare URLs and e-mail addresses after parsing, escapes or not: a zero-width space
# after the scheme (or www, or @) keeps them text.
_AUTOLINK = re.compile(r"(?i)(\b(?:https?|ftp|mailto|xmpp|www)(?=[:.])|@)")


def md(text: object) -> str:
    """A string from a trace, diag_run.json or a file name, for a Streamlit element that renders
    Markdown (caption, warning, subheader, metric label...): shown as written, never interpreted."""
    plain = _AUTOLINK.sub("\\1\u200b", " ".join(str(text).split()))
    return _MD_SPECIAL.sub(r"\\\1", plain)


def ms(seconds: Optional[float], digits: int = 1) -> str:
    return "unknown" if seconds is None else f"{seconds * 1e3:,.{digits}f} ms"


def pct(ratio: Optional[float]) -> str:
    return "unknown" if ratio is None else f"{100 * ratio:.1f}%"


def rate(x: Optional[float]) -> str:
    return "unknown" if x is None else f"{x:,.0f}"


def table(header: list[str], rows: list[list[str]]) -> None:
    st.dataframe([dict(zip(header, r)) for r in rows], hide_index=True, width="stretch")
