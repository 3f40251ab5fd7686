"""Write a Prometheus file_sd targets file for one training job (docs/live-metrics.md).

Every rank of the trainer serves `/metrics` on `--prometheus-port + LOCAL_RANK` of its node, so
a job's targets are its nodes times its ranks per node. Where the nodes come from depends on the
scheduler:

    # SLURM, in the batch script (nodes from SLURM_JOB_NODELIST, ranks from
    # SLURM_NTASKS_PER_NODE or SLURM_GPUS_ON_NODE):
    python targets.py slurm --port 9700 -o /shared/prometheus/targets/$SLURM_JOB_ID.json
    # Kubernetes (or anything else): pod IPs or host names, one per line, on stdin:
    kubectl get pods -l job-name=gpt -o jsonpath='{range .items[*]}{.status.podIP}{"\\n"}{end}' \
      | python targets.py hosts - --ranks-per-node 8 --port 9700 -o targets/gpt.json
    # Fixed hosts:
    python targets.py hosts node1 node2 --ranks-per-node 8 --port 9700

The file is written atomically (Prometheus re-reads it on change); delete it when the job ends.
Standard library only: it runs on a login node without the project installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def expand_hostlist(spec: str) -> list[str]:
    """SLURM's compact host list ("gpu[01-03,07],login1") -> host names, in order."""
    hosts, depth, part = [], 0, ""
    for ch in spec + ",":
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            hosts.extend(_expand_one(part.strip()) if part.strip() else [])
            part = ""
        else:
            part += ch
    return hosts


def _expand_one(item: str) -> list[str]:
    match = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", item)
    if not match:
        return [item]
    prefix, ranges, rest = match.groups()
    names = []
    for rng in ranges.split(","):
        lo, _, hi = rng.partition("-")
        for n in range(int(lo), int(hi or lo) + 1):
            names.extend(prefix + str(n).zfill(len(lo)) + tail for tail in _expand_one(rest))
    return names


def slurm_hosts(nodelist: str | None) -> list[str]:
    spec = nodelist or os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not spec:
        raise SystemExit("error: no --nodelist and SLURM_JOB_NODELIST is not set")
    if shutil.which("scontrol"):  # the scheduler's own expansion when it is at hand
        out = subprocess.run(["scontrol", "show", "hostnames", spec], capture_output=True,
                             text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()
    return expand_hostlist(spec)


def slurm_ranks_per_node() -> int | None:
    for var in ("SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE"):
        value = os.environ.get(var, "").split("(")[0]  # "8(x2)" -> "8"
        if value.isdigit():
            return int(value)
    return None


def targets(hosts: list[str], ranks_per_node: int, port: int, labels: dict) -> list[dict]:
    """One target group: every host x every local rank's port."""
    if ranks_per_node < 1 or not (0 < port and port + ranks_per_node - 1 < 65536):
        raise SystemExit("error: --ranks-per-node must be >= 1 and the ports valid")
    addrs = [f"{h}:{port + r}" for h in hosts for r in range(ranks_per_node)]
    return [{"targets": addrs, "labels": labels}]


def write_atomic(path: str, groups: list[dict]) -> None:
    text = json.dumps(groups, indent=2) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    if os.path.exists(path) and not (os.path.isfile(path) or os.path.isdir(path)):
        with open(path, "w", encoding="utf-8") as f:      # /dev/stdout, a FIFO: in place, as `>` would
            f.write(text)
        return
    # an exclusive temporary (mkstemp) renamed over path: a link planted at a predictable
    # temporary name is never followed, and Prometheus never reads half a file
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=f".{os.path.basename(path)}.",
                               suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", choices=["slurm", "hosts"])
    p.add_argument("hosts", nargs="*", help="hosts, or '-' to read them from stdin (hosts mode)")
    p.add_argument("--nodelist", help="SLURM host list (default: $SLURM_JOB_NODELIST)")
    p.add_argument("--ranks-per-node", type=int, help="default under SLURM: tasks or GPUs per node")
    p.add_argument("--port", type=int, default=9700, help="the trainer's --prometheus-port")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="extra target label (the `job` label comes from the trainer)")
    p.add_argument("-o", "--output", default="-", help="targets file (default: stdout)")
    args = p.parse_args(argv)
    labels = dict(item.split("=", 1) for item in args.label)
    if args.source == "slurm":
        hosts, per_node = slurm_hosts(args.nodelist), args.ranks_per_node or slurm_ranks_per_node()
        if "SLURM_JOB_ID" in os.environ:
            labels.setdefault("slurm_job_id", os.environ["SLURM_JOB_ID"])
    else:
        hosts = sys.stdin.read().split() if args.hosts == ["-"] else args.hosts
        per_node = args.ranks_per_node
    if not hosts or per_node is None:
        raise SystemExit("error: need hosts and --ranks-per-node")
    write_atomic(args.output, targets(hosts, per_node, args.port, labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
