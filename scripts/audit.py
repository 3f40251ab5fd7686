#!/usr/bin/env python3
"""Audit the installed dependencies for known vulnerabilities, for CI.

    .venv/bin/python scripts/audit.py          # make audit

1. pip-audit on this environment against OSV, then against PyPI's per-release advisories.
2. Where neither answers (a build network that reaches only the package index), PyPI's project
   JSON (`/pypi/NAME/json`), which lists the advisories of a project's *latest* release: every
   package installed at its latest release is audited that way; every other package is named
   as not audited (its version's advisories are not in that document).

Exit 0 when no known vulnerability is found among what could be audited; 1 when one is (each
printed: package, version, id, fixed in). What was not audited is always said, with why, never
passed off as clean. This project itself (not on PyPI) is left out.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from importlib import metadata

SERVICES = ("osv", "pypi")
TIMEOUT_S = 300
SELF = "diag"
PROJECT_JSON = "https://pypi.org/pypi/{}/json"


def run(service: str) -> tuple[str, list]:
    """('ok', deps) | ('unreachable', reason)."""
    exe = os.path.join(os.path.dirname(sys.executable), "pip-audit")
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        try:
            p = subprocess.run([exe, "-s", service, "-f", "json", "-o", out.name, "--progress-spinner", "off",
                                "--timeout", "20"], capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "unreachable", f"{service}: no answer in {TIMEOUT_S} s"
        except FileNotFoundError:
            sys.exit("scripts/audit.py: pip-audit is not installed (make setup installs the dev extra)")
        try:
            doc = json.loads(open(out.name).read() or "null")
        except ValueError:
            doc = None
    if not isinstance(doc, dict):
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return "unreachable", f"{service}: {last[:300]}"
    deps = doc.get("dependencies", [])
    audited = [d for d in deps if "skip_reason" not in d]
    if not audited:
        return "unreachable", f"{service}: none of {len(deps)} packages could be looked up " \
                              f"({(deps[0].get('skip_reason') if deps else 'no packages')})"
    return "ok", deps


def installed() -> dict[str, str]:
    """{normalised name: version} of this environment's distributions, this project excepted."""
    out = {}
    for d in metadata.distributions():
        name = (d.metadata["Name"] or "").lower().replace("_", "-").replace(".", "-")
        if name and name != SELF:
            out[name] = d.version
    return out


def latest_release(name: str, url: str = PROJECT_JSON) -> tuple[str, object]:
    """(name, (latest version, its live advisories)) or (name, the reason it could not be read)."""
    try:
        with urllib.request.urlopen(url.format(name), timeout=20) as r:
            doc = json.load(r)
        vulns = [v for v in doc.get("vulnerabilities") or [] if not v.get("withdrawn")]
        return name, (doc["info"]["version"], vulns)
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as e:
        return name, f"{type(e).__name__}: {e}"


def audit_latest(reasons: list[str], url: str = PROJECT_JSON) -> int:
    """Fallback 2 (module docstring). Prints the findings; returns the exit status."""
    have = installed()
    with ThreadPoolExecutor(16) as pool:
        answers = dict(pool.map(partial(latest_release, url=url), sorted(have)))
    checked, behind, failed, vulns = [], [], [], []
    for name, version in sorted(have.items()):
        got = answers[name]
        if isinstance(got, str):
            failed.append(f"{name} ({got[:80]})")
        elif got[0] != version:
            behind.append(f"{name} {version} (latest {got[0]})")
        else:
            checked.append(name)
            vulns += [(name, version, v) for v in got[1]]
    for name, version, v in vulns:
        fix = ", ".join(v.get("fixed_in") or []) or "no fix yet"
        print(f"audit: {name} {version}: {v.get('id')} (fixed in: {fix})")
    print("audit: pip-audit could not reach its services (" + "; ".join(reasons) + ")")
    print(f"audit (PyPI project JSON): {len(checked)} of {len(have)} packages at their latest release "
          f"checked, {len(vulns)} known vulnerabilities")
    if behind:
        print(f"audit: NOT AUDITED, older than their latest release ({len(behind)}): " + ", ".join(behind))
    if failed:
        print(f"audit: NOT AUDITED, no answer ({len(failed)}): " + ", ".join(failed))
    if not checked:
        print("audit: NOT AUDITED: no package could be checked")
    return 1 if vulns else 0


def main() -> int:
    reasons = []
    for service in SERVICES:
        status, got = run(service)
        if status == "unreachable":
            reasons.append(got)
            continue
        vulns = [(d["name"], d["version"], v) for d in got for v in d.get("vulns", [])]
        skipped = [d["name"] for d in got if "skip_reason" in d]
        for name, version, v in vulns:
            fix = ", ".join(v.get("fix_versions") or []) or "no fix yet"
            print(f"audit: {name} {version}: {v.get('id')} (fixed in: {fix})")
        print(f"audit ({service}): {len(got) - len(skipped)} packages checked, {len(vulns)} known "
              f"vulnerabilities" + (f"; not on PyPI, not audited: {', '.join(skipped)}" if skipped else ""))
        return 1 if vulns else 0
    return audit_latest(reasons)


if __name__ == "__main__":
    sys.exit(main())
