"""The sidebar's "layout and model shape": the CLI's run flags, settable in the app.

Problem: a trace from another trainer often does not carry its layout or model shape, and
the user who opened it in the dashboard should not have to restart `diag dashboard` with
--tp/--pp/--global-batch-size to get tokens/s, MFU or a layout. The same RunInputs the CLI
builds (diag.runinputs: SIZE_FLAGS, SHAPE_FLAGS, --config) is built here from inputs that
start from the flags `diag dashboard` was given; the run is re-diagnosed when they change,
through the same open_run, and each combination is cached (diag_runs.load_run's key).
A --config file must lie under the dashboard's root, like every file the app opens.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

import streamlit as st

from diag.runinputs import SHAPE_FLAGS, SIZE_FLAGS, RunInputs
from diag_runs import inside


def _number(label: str, key: str, value: Optional[int], help: str) -> Optional[int]:
    got = st.number_input(label, min_value=1, value=value, step=1, key=f"in_{key}", help=help,
                          placeholder="from the run")
    return None if got is None else int(got)


def _config(root: Path, given: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """(the config file to use, or the reason it is refused)."""
    name = st.text_input("--config (a file under the root)", value=given or "", key="in_config",
                         help="Megatron-LM arguments or a torchtitan TOML: layout, batch and model shape.").strip()
    if not name:
        return None, None
    p = Path(name) if os.path.isabs(name) else root / name
    if not p.is_file() or not inside(root, p):
        return None, f"--config {name!r} refused: not a file under {root}"
    return str(p), None


def sidebar_inputs(root: Path) -> RunInputs:
    """The RunInputs of the run shown: `diag dashboard`'s flags, changed in the sidebar."""
    base = RunInputs.from_json(os.environ.get("DIAG_DASHBOARD_INPUTS"))
    with st.sidebar.expander("Layout and model shape (the CLI's flags)"):
        st.caption("Empty: read from the traces, diag_run.json or --config. A change re-diagnoses the run.")
        sizes = {k: _number(long, k, base.sizes.get(k), what) for k, long, what in SIZE_FLAGS}
        shape = {k: _number("--" + k.replace("_", "-"), k, base.shape.get(k), what) for k, what in SHAPE_FLAGS}
        config, refused = _config(root, base.config)
    if refused:
        st.sidebar.error(refused)
    kept = {k: v for k, v in base.shape.items() if k not in dict(SHAPE_FLAGS)}     # swiglu, pipeline_schedule
    return dataclasses.replace(base, sizes={k: v for k, v in sizes.items() if v is not None},
                               shape={**kept, **{k: v for k, v in shape.items() if v is not None}},
                               config=config)
