"""JSON rendering: the Diagnosis dataclasses as they are (schema in docs/schema.md)."""
from __future__ import annotations

import msgspec

from ..analysis.results import Diagnosis


def render_json(d: Diagnosis) -> str:
    return msgspec.json.format(msgspec.json.encode(d), indent=2).decode() + "\n"
