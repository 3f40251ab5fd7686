"""`diag dashboard [PATH]`: start the Streamlit app on a folder of runs.

The app may read only under --root (default: PATH's parent folder when PATH is given,
else the current folder); it is told so, with the run to open first and the upload cap,
through environment variables. It binds to 127.0.0.1 unless --address says otherwise,
because a trace names hosts, paths and model shapes.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import click

from ..ports import free_port
from ..runinputs import RunInputs, run_options

APP = Path(__file__).resolve().parents[2] / "dashboards" / "app.py"     # diag/commands/ -> the repo


def resolve_root(path: Optional[str], root: Optional[str]) -> tuple[Path, Optional[str]]:
    """(root, PATH relative to root or None). PATH outside the root is a usage error."""
    if root:
        r = Path(root).resolve()
    elif path:
        r = Path(path).resolve().parent
    else:
        r = Path.cwd().resolve()
    if not r.is_dir():
        raise click.BadParameter(f"{r}: not a directory", param_hint="--root")
    if path is None:
        return r, None
    p = Path(path).resolve()
    if not p.exists():
        raise click.BadParameter(f"{path}: no such file or directory", param_hint="PATH")
    if not p.is_relative_to(r):
        raise click.BadParameter(f"{path} is outside the root {r}", param_hint="PATH")
    return r, str(p.relative_to(r)) or "."


def streamlit_argv(port: int, address: str, max_upload_mb: int) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", address,
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.maxUploadSize", str(max_upload_mb), "--server.fileWatcherType", "none",
            "--global.developmentMode", "false", "--client.toolbarMode", "viewer"]


def app_env(root: Path, run: Optional[str], max_upload_mb: int, inputs: Optional[RunInputs] = None) -> dict:
    env = dict(os.environ, DIAG_DASHBOARD_ROOT=str(root), DIAG_DASHBOARD_MAX_UPLOAD_MB=str(max_upload_mb),
               DIAG_DASHBOARD_INPUTS=(inputs or RunInputs()).to_json())
    if run:
        env["DIAG_DASHBOARD_RUN"] = run
    else:
        env.pop("DIAG_DASHBOARD_RUN", None)
    return env


@click.command()
@click.argument("path", required=False, type=click.Path())
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="The only folder the app may read (default: PATH's parent, else the current folder).")
@click.option("--port", type=click.IntRange(0, 65535), default=8501, show_default=True,
              help="Port to serve on (0: any free port).")
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 exposes the traces to the network.")
@click.option("--max-upload-mb", type=click.IntRange(1, 10_000), default=500, show_default=True,
              help="Largest upload accepted, in MB (all files of one upload together).")
@run_options
def dashboard(path: Optional[str], root: Optional[str], port: int, address: str, max_upload_mb: int,
              inputs: RunInputs) -> None:
    """Browse runs in a Streamlit app: one run's story, or two runs side by side.

    The layout, config file and model-shape flags are those of `diag analyze`; the app opens
    every run with them."""
    try:
        import streamlit  # noqa: F401
        import plotly  # noqa: F401
    except ImportError:
        click.echo("diag: error: the dashboard needs streamlit and plotly: pip install 'diag[dashboard]'", err=True)
        sys.exit(2)
    r, run = resolve_root(path, root)
    port = port or free_port(address)
    click.echo(f"diag dashboard: http://{address}:{port}/  (root {r}{', run ' + run if run else ''})", err=True)
    argv = streamlit_argv(port, address, max_upload_mb)
    os.execve(sys.executable, argv, app_env(r, run, max_upload_mb, inputs))
