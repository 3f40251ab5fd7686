"""Renderers: a Diagnosis in, text / JSON / Markdown out. No analysis happens here."""
from .jsonfmt import render_json
from .markdown import render_markdown
from .text import render_text

RENDERERS = {"text": render_text, "json": render_json, "markdown": render_markdown}

__all__ = ["RENDERERS", "render_json", "render_markdown", "render_text"]
