#!/usr/bin/env python3
"""Check that a change to the trace decoder leaves every analysis result as it was.

`diag analyze --format json` is run on every real trace (each folder of tests/data, of
shared/traces when present, and any file or folder given) and its output is saved (--save DIR)
or compared with what was saved (--check DIR). Paths are made relative so that two checkouts
compare; nothing in the JSON is a timing of diag itself, so the rest must be equal, number for
number. Used before and after a speed-up of the decode path (benchmarks/README.md).

    python benchmarks/same_output.py --save /tmp/before        # on the old code
    python benchmarks/same_output.py --check /tmp/before       # on the new code: exit 1 on a difference
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "traces")


def inputs(extra: list[str]) -> list[str]:
    found = []
    for base in (os.path.join(ROOT, "tests", "data"), os.environ.get("DIAG_SHARED_TRACES", SHARED)):
        if os.path.isdir(base):
            found += sorted(os.path.join(base, d) for d in os.listdir(base)
                            if os.path.isdir(os.path.join(base, d)))
    return found + [os.path.abspath(p) for p in extra]


def key(path: str) -> str:
    """A file name for path's output that two checkouts agree on."""
    rel = os.path.relpath(path, ROOT) if path.startswith(ROOT) else path
    return rel.strip("/").replace("/", "__").replace("..", "up") + ".json"


def analyse(path: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "diag", "analyze", path, "--format", "json"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        return json.dumps({"error": done.stderr.strip().splitlines()[-1:]})
    return _relative(done.stdout)


def _relative(text: str) -> str:
    """Absolute paths of this checkout and of the traces, made relative (they differ per checkout)."""
    return text.replace(ROOT + "/", "").replace(ROOT, ".")


def diff(a, b, where="$") -> list[str]:
    if type(a) is not type(b):
        return [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = [f"{where}.{k}: only in one" for k in set(a) ^ set(b)]
        for k in a.keys() & b.keys():
            out += diff(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", metavar="DIR")
    mode.add_argument("--check", metavar="DIR")
    ap.add_argument("paths", nargs="*", help="more trace files or folders (e.g. the bench inputs)")
    args = ap.parse_args(argv)
    failed = 0
    for path in inputs(args.paths):
        out = analyse(path)
        if args.save:
            os.makedirs(args.save, exist_ok=True)
            with open(os.path.join(args.save, key(path)), "w") as f:
                f.write(out)
            print(f"saved  {path}")
            continue
        with open(os.path.join(args.check, key(path))) as f:
            before = json.load(f)
        problems = diff(before, json.loads(out))
        failed += bool(problems)
        print(f"{'DIFF' if problems else 'same'}   {path}" + "".join(f"\n    {p}" for p in problems[:20]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
