"""`attnserve attention`'s exports: one text's (or pair's) attention and its analyses, fetched from a server, as a
figure for a paper (.png, .svg, .pdf), a standalone explorer page (.html) or the arrays (.npz, .json).

A view picks the figure: heatmap (a layer's head, or the mean of its heads), heads (BertViz's head view of a layer),
model (every layer x head), rollout, norms (norm-weighted attention of a layer's head, or summed over its heads),
stats (the per-head statistics). The data formats hold everything, whatever the view: every layer's weights, the
analyses, the word pieces and where a pair's segment b starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnserve.errors import AttnserveError

VIEWS = ("heatmap", "heads", "model", "rollout", "norms", "stats")
FIGURES = (".png", ".svg", ".pdf")
DATA = (".npz", ".json")
EXTENSIONS = (*FIGURES, ".html", *DATA)
# The views a --head applies to (the others show every head, or none).
HEAD_VIEWS = ("heatmap", "heads", "norms")
# The views of one layer (the others show every layer).
LAYER_VIEWS = ("heatmap", "heads", "norms")


@dataclass
class AttentionData:
    """One input's attention as a server returned it."""

    model: str
    text: str
    pair: str | None
    tokens: list[str]
    truncated: bool
    pair_start: int | None
    layers: list[int]  # the layers of attentions and norms, as non-negative indices
    attentions: np.ndarray  # (layers, nh, T, T)
    rollout: np.ndarray  # (T, T)
    head_stats: dict[str, np.ndarray]  # name -> (L, nh)
    norms: np.ndarray | None  # (layers, nh, T, T), where the model gives value norms
    norms_summed: np.ndarray | None  # (layers, T, T)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by name, for .npz and .json."""
        out = {"attentions": self.attentions, "layers": np.array(self.layers), "rollout": self.rollout,
               "tokens": np.array(self.tokens),
               "pair_start": np.array(-1 if self.pair_start is None else self.pair_start)}  # -1: not a pair
        out |= {f"head_stats_{name}": grid for name, grid in self.head_stats.items()}
        if self.norms is not None and self.norms_summed is not None:
            out |= {"norms": self.norms, "norms_summed": self.norms_summed}
        return out

    def reply(self) -> dict:
        """The data as a /v1/attention reply (its arrays numpy's), for the standalone explorer page."""
        item: dict[str, object] = {
            "index": 0, "tokens": self.tokens, "num_tokens": len(self.tokens), "truncated": self.truncated,
            "layers": self.layers, "heads": list(range(self.attentions.shape[1])),
            "shape": list(self.attentions.shape), "attentions": self.attentions,
            "rollout": self.rollout, "head_stats": dict(self.head_stats)}
        if self.pair_start is not None:
            item["pair_start"] = self.pair_start
        if self.norms is not None and self.norms_summed is not None:
            item |= {"norms": self.norms, "norms_summed": self.norms_summed}
        return {"object": "list", "model": self.model, "data": [item], "text": self.text, "pair": self.pair}


def check_request(view: str, path: Path, head: int | None, scale: str = "fixed") -> None:
    """A combination that cannot be drawn, in one line, before the server is asked."""
    from .plot import SCALES

    if path.suffix.lower() not in EXTENSIONS:
        raise AttnserveError(f"-o {path}: the file type follows the extension, one of {', '.join(EXTENSIONS)}")
    if view not in VIEWS:
        raise AttnserveError(f"--view {view} is not one of {', '.join(VIEWS)}")
    if scale not in SCALES:
        raise AttnserveError(f"--scale {scale} is not one of {', '.join(SCALES)}")
    if head is not None and view not in HEAD_VIEWS and path.suffix.lower() in FIGURES:
        raise AttnserveError(f"--head does not apply to --view {view}: it shows "
                             + ("every head" if view == "model" else "every layer and head" if view == "stats"
                                else "the heads' mean flow"))


def fetch(client, text: str, pair: str | None, layer: int, num_layers: int, view: str, path: Path,
          norms: bool) -> AttentionData:
    """The weights of `layer` (or of every layer: the model view and the data formats), rollout, head_stats and, where
    the view or the format needs them and the model has them (norms), norm-weighted attention."""
    every_layer = view == "model" or path.suffix.lower() not in FIGURES
    layers = list(range(num_layers)) if every_layer else [layer % num_layers]
    analyses = ["rollout", "head_stats"] + (["norms"] if norms and (every_layer or view == "norms") else [])
    result = client.attention((text, pair) if pair is not None else text, layers, truncate=True, analyses=analyses)
    assert result.attentions is not None and result.rollout is not None and result.head_stats is not None
    return AttentionData(client.model or "", text, pair, list(result.tokens), result.truncated, result.pair_start,
                         layers, result.attentions, result.rollout, result.head_stats, result.norms,
                         result.norms_summed)


def write(data: AttentionData, model: str, view: str, path: Path, head: int | None, scale: str) -> str:
    """Write the file; returns what was written, for the command's one line."""
    suffix = path.suffix.lower()
    if suffix == ".npz":
        _writable(path)
        np.savez_compressed(path, **data.arrays())  # type: ignore[arg-type]  # numpy types allow_pickle as a keyword
        return "every layer's weights and the analyses"
    if suffix == ".json":
        _writable(path)
        body = {name: value.tolist() for name, value in data.arrays().items()} | {"model": model, "text": data.text,
                                                                                   "pair": data.pair}
        _write_text(path, json.dumps(body))
        return "every layer's weights and the analyses"
    if suffix == ".html":
        from attnserve.explorer_page import standalone_html

        reply = data.reply() | {"model": model}
        _write_text(path, standalone_html(reply))
        return "a standalone explorer of every layer"
    return _figure(data, model, view, path, head, scale)


def _figure(data: AttentionData, model: str, view: str, path: Path, head: int | None, scale: str) -> str:
    from .plot import draw_grid, draw_heads, draw_map, draw_stats

    quoted = data.text if len(data.text) <= 60 else data.text[:57] + "..."
    about = f'{model}: "{quoted}"' + (" (with a pair)" if data.pair is not None else "") + \
        (" (truncated)" if data.truncated else "")
    nh = data.attentions.shape[1]
    where = 0  # a view of one layer fetched that layer alone (fetch)
    shown_layer = data.layers[where]
    which = f"mean of {nh} heads" if head is None else f"head {head % nh}"
    if view == "heatmap":
        maps = data.attentions[where]  # (nh, T, T)
        draw_map(maps.mean(axis=0) if head is None else maps[head], data.tokens,
                 f"{about}\nlayer {shown_layer}, {which}", path, scale)
        return f"layer {shown_layer}, {which}"
    if view == "heads":
        heads = list(range(nh)) if head is None else [head % nh]
        draw_heads(data.attentions[where], data.tokens, heads, f"{about}\nhead view, layer {shown_layer}", path)
        return f"head view of layer {shown_layer}, {len(heads)} head(s)"
    if view == "model":
        draw_grid(data.attentions, data.layers, f"{about}\nmodel view: every layer x head", path, scale)
        return f"model view, {len(data.layers)} layers x {nh} heads"
    if view == "rollout":
        draw_map(data.rollout, data.tokens, f"{about}\nattention rollout (Abnar & Zuidema, 2020)", path, scale,
                 label="rollout")
        return "attention rollout"
    if view == "norms":
        if data.norms is None or data.norms_summed is None:
            raise AttnserveError(f"{model} gives no value norms: --view norms needs them")
        values = data.norms_summed[where] if head is None else data.norms[where, head]
        which = "summed over heads" if head is None else f"head {head % nh}"
        draw_map(values, data.tokens, f"{about}\n||a f(x)|| (Kobayashi et al., 2020), layer {shown_layer}, {which}",
                 path, scale, label="norm", bounded=False)
        return f"norm-weighted attention, layer {shown_layer}, {which}"
    draw_stats(data.head_stats, f"{about}\nper-head statistics (layers x heads)", path)
    return f"head statistics, {len(data.head_stats)} grids"


def _writable(path: Path) -> None:
    if not path.parent.is_dir():
        raise AttnserveError(f"cannot write {path}: no such directory {path.parent}")


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise AttnserveError(f"cannot write {path}: {e.strerror}") from None
