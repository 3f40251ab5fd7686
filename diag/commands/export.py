"""`diag export PATH --prometheus FILE [--pushgateway URL --job NAME]`: a thin command.

Parse, load and diagnose the traces exactly as `diag analyze` does, then write the Diagnosis in
Prometheus text format (FILE, or '-' for stdout) and/or push it to a Pushgateway. Exit codes as
`diag analyze`: 0 success, 2 bad input, usage, a missing prometheus-client or a failed push.
"""

from __future__ import annotations

import os
import sys

import click

from ..cli import diagnose_or_exit
from ..runinputs import run_options


def _fail(message: str) -> None:
    click.echo(f"diag: error: {message}", err=True)
    sys.exit(2)


@click.command()
@click.argument("path", type=click.Path())
@click.option("--prometheus", "textfile", metavar="FILE",
              help="Write the diagnosis in Prometheus text format to FILE ('-': stdout). For "
                   "node_exporter's textfile collector, name it *.prom in its directory.")
@click.option("--pushgateway", metavar="URL", help="Also push it to this Pushgateway.")
@click.option("--job", metavar="NAME",
              help="`job` label (and Pushgateway group); default: the traces' directory name.")
@click.option("--force", is_flag=True, help="Write FILE even over an input or inside the analysed directory.")
@run_options
def export(path, textfile, pushgateway, job, force, inputs) -> None:
    """Export the diagnosis of PATH's traces as Prometheus metrics."""
    from ..cli import refuse_or_exit, run_files
    from ..export import prometheus

    if not textfile and not pushgateway:
        _fail("nothing to do: give --prometheus FILE and/or --pushgateway URL")
    refuse_or_exit(textfile, lambda: run_files(path, inputs), force)
    name = job or os.path.basename(os.path.abspath(path).rstrip(os.sep)) or "diag"
    diagnosis = diagnose_or_exit(path, inputs)
    try:
        if textfile == "-":
            click.echo(prometheus.to_text(diagnosis, name), nl=False)
        elif textfile:
            prometheus.write_textfile(diagnosis, name, textfile)
        if pushgateway:
            prometheus.push(diagnosis, name, pushgateway)
    except RuntimeError as e:  # prometheus-client missing
        _fail(str(e))
    except OSError as e:  # unwritable file, unreachable gateway (URLError is an OSError)
        _fail(f"{textfile if textfile and not pushgateway else pushgateway}: {e}")
