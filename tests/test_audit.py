"""scripts/audit.py's fallback (PyPI project JSON, advisories of the latest release) flags a
vulnerable package, names the ones it could not audit, and fails the run. The server is a real
HTTP server on loopback answering in PyPI's format (pypi.org's own answers for this environment
list no advisory, so they cannot show that the audit fails when it should)."""
from __future__ import annotations

import importlib.util
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _audit_module():
    spec = importlib.util.spec_from_file_location("audit", os.path.join(ROOT, "scripts", "audit.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def index():
    """{name: (latest version, advisories)} served as /pypi/NAME/json; other names: 404."""
    docs = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            name = self.path.split("/")[2]
            if name not in docs:
                self.send_error(404)
                return
            version, vulns = docs[name]
            body = json.dumps({"info": {"version": version}, "vulnerabilities": vulns}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield docs, f"http://127.0.0.1:{server.server_address[1]}/pypi/{{}}/json"
    server.shutdown()
    server.server_close()


def test_a_vulnerable_latest_release_fails_the_audit(index, capsys):
    docs, url = index
    audit = _audit_module()
    have = audit.installed()
    assert "numpy" in have and "diag" not in have            # this project is left out
    for name, version in have.items():
        docs[name] = (version, [])
    docs["numpy"] = (have["numpy"], [{"id": "PYSEC-0000-1", "fixed_in": ["99.0"], "withdrawn": None},
                                     {"id": "GHSA-gone", "fixed_in": [], "withdrawn": "2026-01-01"}])
    docs["click"] = ("999.0", [])                             # installed is older: not audited
    del docs["rich"]                                          # no answer: not audited
    assert audit.audit_latest(["osv: unreachable"], url) == 1
    out = capsys.readouterr().out
    assert f"audit: numpy {have['numpy']}: PYSEC-0000-1 (fixed in: 99.0)" in out
    assert "GHSA-gone" not in out                              # withdrawn advisories do not count
    assert f"{len(have) - 2} of {len(have)} packages at their latest release checked, 1 known" in out
    assert f"click {metadata.version('click')} (latest 999.0)" in out
    assert "NOT AUDITED, no answer (1): rich (HTTPError" in out


def test_nothing_known_passes_and_says_what_was_not_audited(index, capsys):
    docs, url = index
    audit = _audit_module()
    have = audit.installed()
    docs.update({name: (version, []) for name, version in have.items() if name != "numpy"})
    assert audit.audit_latest([], url) == 0
    out = capsys.readouterr().out
    assert "0 known vulnerabilities" in out and "no answer (1): numpy" in out
