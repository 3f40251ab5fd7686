"""Renderers: a Diagnosis in, text / JSON / Markdown out. No analysis happens here."""
from importlib import import_module

# Imported on use: the JSON path should not pay for rich (terminal tables).
_RENDERERS = {"text": ("text", "render_text"), "json": ("jsonfmt", "render_json"),
              "markdown": ("markdown", "render_markdown"),
              "html": ("html", "render_html")}
FORMATS = tuple(_RENDERERS)


def renderer(fmt: str):
    """The function that renders a Diagnosis as fmt, its module imported (rich for text)."""
    module, func = _RENDERERS[fmt]
    return getattr(import_module(f"{__name__}.{module}"), func)


def render(diagnosis, fmt: str) -> str:
    return renderer(fmt)(diagnosis)


__all__ = ["FORMATS", "render", "renderer"]
