"""The attention explorer's page: one HTML page that draws POST /v1/attention's maps (a heatmap, a head view, every
layer and head, rollout, norms, head statistics, a comparison). The HTTP door serves it at GET /explorer
(server/http/explorer.py), and standalone_html() writes the same page with one reply embedded, to open
from a file with no server (the client's to_html, `attnserve attention -o FILE.html`): here, below both.

The page is plain HTML, CSS and JavaScript from package data (attnserve/explorer_static/), with no framework and nothing
fetched from elsewhere: the scripts and the style sheet are inlined into the page, so that a standalone file is
that page plus its data. The served page's Content-Security-Policy allows exactly those inline scripts and style
(by their sha256) and requests to this server, so that no text of an input can run as script in it.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources

import numpy as np
import orjson

STATIC = "explorer_static"
# Where the data goes in a standalone file: explorer.js's embed() replaces the same marker.
DATA_MARKER = "<!-- attnserve:data -->"
_SCRIPT = re.compile(r'<script src="([\w.-]+\.js)"></script>')
_STYLE = re.compile(r'<link rel="stylesheet" href="([\w.-]+\.css)">')
# The arrays of a reply's item, each row-major float32: nested lists become base64 (encoding_format's), which a
# file holds in 5.3 bytes a float rather than about 12, and the page decodes without parsing a number.
_ARRAYS = ("attentions", "rollout", "norms", "norms_summed")


def _static(name: str) -> str:
    return (resources.files("attnserve") / STATIC / name).read_text(encoding="utf-8")


def _inline(tag: str, content: str) -> str:
    # Either would change where an HTML parser ends the element ("<!--" can hide a later "</script>")
    for text in (f"</{tag}", "<!--"):
        if text in content.lower():
            raise ValueError(f"explorer_static: a file inlined into <{tag}> contains {text!r}")
    return f"<{tag}>{content}</{tag}>"


@cache
def page() -> tuple[str, str]:
    """The page with its scripts and style sheet inlined, and the Content-Security-Policy that allows them."""
    html = _static("index.html")
    scripts: list[str] = []
    styles: list[str] = []

    def script(match: re.Match) -> str:
        scripts.append(_static(match.group(1)))
        return _inline("script", scripts[-1])

    def style(match: re.Match) -> str:
        styles.append(_static(match.group(1)))
        return _inline("style", styles[-1])

    html = _STYLE.sub(style, _SCRIPT.sub(script, html))
    if not scripts or not styles or DATA_MARKER not in html:
        raise ValueError("explorer_static/index.html lost its scripts, its style sheet or its data marker")

    def hashes(texts: list[str]) -> str:
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(t.encode()).digest()).decode()}'" for t in texts)

    policy = (f"default-src 'none'; script-src {hashes(scripts)}; style-src {hashes(styles)}; connect-src 'self'; "
              "img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return html, policy


def standalone_html(reply: dict) -> str:
    """The explorer page with `reply` embedded: a /v1/attention reply of one input, with every layer and every
    head (the analyses rollout, head_stats and norms shown where present), its arrays as base64, float lists or
    numpy arrays (written as base64). The file opens from file:// alone: its scripts, style and data are in it."""
    data = reply.get("data")
    if not isinstance(data, list) or len(data) != 1:
        raise ValueError(f"a standalone page shows one input; this reply has "
                         f"{len(data) if isinstance(data, list) else 'no'} items in `data`")
    entry = data[0]
    if entry.get("attentions") is None or entry.get("shape") is None:
        raise ValueError("a standalone page needs the attention weights: this reply was asked with weights false")
    if entry["shape"][1] != len(entry.get("heads") or []):
        raise ValueError("a standalone page needs every head's map: this reply averages its heads")
    # "<" escaped, so that no text in the data (a word piece "</script>") can close the element
    payload = orjson.dumps({**reply, "data": [_compact(entry)]}, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    payload = payload.replace("<", "\\u003c")
    html, _ = page()
    return html.replace(DATA_MARKER, f"<script>window.ATTNSERVE_DATA = {payload};</script>", 1)


def _compact(entry: dict) -> dict:
    """The item with its arrays as base64 of float32, whichever way they came (base64, nested lists, numpy)."""
    def base64_of(value):
        if isinstance(value, str):
            return value
        return base64.b64encode(np.ascontiguousarray(value, dtype="<f4").tobytes()).decode("ascii")

    out = {**entry, **{name: base64_of(entry[name]) for name in _ARRAYS if entry.get(name) is not None}}
    if entry.get("head_stats") is not None:
        out["head_stats"] = {name: base64_of(grid) for name, grid in entry["head_stats"].items()}
    return out
