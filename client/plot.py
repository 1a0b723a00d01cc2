"""Attention heatmaps labelled with the word pieces the server returned."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnserve.errors import AttnserveError


def pyplot():
    """matplotlib.pyplot for drawing into files, or a clear error when matplotlib (a dependency) is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display is needed or assumed
        import matplotlib.pyplot as plt
    except ImportError:
        raise AttnserveError("drawing needs matplotlib, which attnserve depends on: pip install matplotlib") from None
    return plt


def save_figure(fig, path: Path) -> None:
    """Write and close the figure; an unwritable path or unknown extension is one clear error."""
    plt = pyplot()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise AttnserveError(f"cannot write {path}: {e.strerror}") from None
    except ValueError as e:  # an extension matplotlib has no writer for
        raise AttnserveError(f"cannot write {path}: {e}") from None
    finally:
        plt.close(fig)


def draw_attention(weights: np.ndarray, tokens: Sequence[str], title: str, path: Path) -> None:
    """weights (T, T): row i is how token i attends to every token (query -> key)."""
    plt = pyplot()
    T = len(tokens)
    assert weights.shape == (T, T), (weights.shape, T)
    size = min(4 + 0.28 * T, 40)  # inches: labels stay legible up to the 256-token limit
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=float(weights.max()) or 1.0)
    ax.set_xticks(range(T), labels=tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(T), labels=tokens, fontsize=8)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    with warnings.catch_warnings():
        # Word pieces of scripts the default font lacks (CJK, emoji) are drawn as boxes, and matplotlib warns once
        # per missing glyph: lines of noise for one picture whose labels are still in the order of the tokens.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.tight_layout()
        save_figure(fig, path)


# How a map's colours are scaled: fixed 0..1 (maps compare), each row to its largest weight, or logarithmic.
SCALES = ("fixed", "row", "log")
# The smallest weight a logarithmic scale shows: below it, everything is the same dark colour.
LOG_FLOOR = 1e-4


def _scaled(weights: np.ndarray, scale: str):
    """(values to draw, norm for imshow, colour bar label)."""
    from matplotlib.colors import LogNorm, Normalize

    if scale == "row":
        peaks = weights.max(axis=-1, keepdims=True)
        return (np.divide(weights, peaks, where=peaks > 0, out=np.zeros_like(weights)), Normalize(0.0, 1.0),
                "weight / row's largest")
    if scale == "log":
        return np.maximum(weights, LOG_FLOOR), LogNorm(LOG_FLOOR, max(float(weights.max()), LOG_FLOOR * 10)), \
            "weight (log)"
    return weights, Normalize(0.0, max(1.0, float(weights.max()))), "weight"


def _quiet_layout(fig, path: Path, top: float = 1.0) -> None:
    """Lay out and save; top: the share of the height the axes may take (below a figure's suptitle)."""
    with warnings.catch_warnings():  # glyphs the font lacks: see draw_attention
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.tight_layout(rect=(0.0, 0.0, 1.0, top))
        save_figure(fig, path)


def draw_map(values: np.ndarray, tokens: Sequence[str], title: str, path: Path, scale: str = "fixed",
             label: str = "attention weight", bounded: bool = True) -> None:
    """values (T, T), query rows x key columns, on the scale asked, labelled with the word pieces; label names
    the quantity (attention weight, rollout, norm); bounded: a weight in 0..1 (fixed is then 0..1), else a
    quantity whose fixed scale is 0..its largest (norms)."""
    plt = pyplot()
    T = len(tokens)
    assert values.shape == (T, T), (values.shape, T)
    shown, norm, bar = _scaled(values, scale) if bounded else _scaled_other(values, scale)
    size = min(4 + 0.28 * T, 40)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(shown, cmap="viridis", norm=norm)
    ax.set_xticks(range(T), labels=tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(T), labels=tokens, fontsize=8)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=f"{label} ({bar})" if scale != "fixed" else label)
    _quiet_layout(fig, path)


def _scaled_other(values: np.ndarray, scale: str):
    """A quantity that is not a weight in 0..1 (norms): fixed is 0..its largest."""
    from matplotlib.colors import LogNorm, Normalize

    peak = max(float(values.max()), 1e-12)
    if scale == "row":
        return _scaled(values, "row")
    if scale == "log":
        return np.maximum(values, peak * LOG_FLOOR), LogNorm(peak * LOG_FLOOR, peak), "log"
    return values, Normalize(0.0, peak), ""


def draw_heads(maps: np.ndarray, tokens: Sequence[str], heads: Sequence[int], title: str, path: Path) -> None:
    """BertViz's head view of one layer: maps (nh, T, T); a line from each query token (left) to each key token
    (right), one colour per head of `heads`, its opacity the weight."""
    plt = pyplot()
    T = len(tokens)
    fig, ax = plt.subplots(figsize=(6, max(3, 0.22 * T + 1)))
    colours = plt.get_cmap("tab20")
    for h in heads:
        colour = colours(h % 20)
        for i in range(T):
            for j in range(T):
                weight = float(maps[h, i, j])
                if weight > 0.01:  # lines too faint to see only slow the drawing
                    ax.plot([0, 1], [T - 1 - i, T - 1 - j], color=colour, alpha=min(1.0, weight), linewidth=1.2)
    for i, token in enumerate(tokens):
        ax.text(-0.02, T - 1 - i, token, ha="right", va="center", fontsize=8)
        ax.text(1.02, T - 1 - i, token, ha="left", va="center", fontsize=8)
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(-1, T)
    ax.axis("off")
    ax.legend(handles=[plt.Line2D([], [], color=colours(h % 20), label=f"head {h}") for h in heads],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=6, fontsize=7, frameon=False)
    ax.set_title(title, fontsize=10)
    _quiet_layout(fig, path)


def draw_grid(maps: np.ndarray, layers: Sequence[int], title: str, path: Path, scale: str = "fixed") -> None:
    """The model view: maps (L, nh, T, T), every layer (rows) x head (columns) as a small map."""
    plt = pyplot()
    L, nh = maps.shape[:2]
    fig, axes = plt.subplots(L, nh, figsize=(1.1 * nh + 1, 1.1 * L + 1), squeeze=False)
    for row in range(L):
        for h in range(nh):
            shown, norm, _ = _scaled(maps[row, h], scale)
            ax = axes[row][h]
            ax.imshow(shown, cmap="viridis", norm=norm)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"head {h}", fontsize=7)
            if h == 0:
                ax.set_ylabel(f"layer {layers[row]}", fontsize=7)
    fig.suptitle(title, fontsize=10)
    _quiet_layout(fig, path, top=1.0 - 0.6 / fig.get_figheight())


def draw_stats(stats: dict[str, np.ndarray], title: str, path: Path) -> None:
    """Each head statistic (attnserve/attention_analyses.py) as a layers x heads grid with its values written in."""
    from attnserve.attention_analyses import HEAD_STATS, PAIR_STATS

    plt = pyplot()
    order = [*HEAD_STATS, *PAIR_STATS]  # a gRPC map has no order: the definitions' order, the same every time
    names = sorted(stats, key=lambda name: order.index(name) if name in order else len(order))
    columns = 3
    rows = -(-len(names) // columns)
    L, nh = next(iter(stats.values())).shape
    fig, axes = plt.subplots(rows, columns, figsize=(columns * (0.45 * nh + 1.5), rows * (0.45 * L + 1.2)),
                             squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= len(names):
            ax.axis("off")
            continue
        grid = stats[names[k]]
        image = ax.imshow(grid, cmap="magma", aspect="auto")
        low, high = float(grid.min()), float(grid.max())
        for (layer, h), value in np.ndenumerate(grid):
            bright = high > low and (value - low) / (high - low) > 0.6  # dark text on the bright end of magma
            ax.text(h, layer, f"{value:.2f}", ha="center", va="center", fontsize=5,
                    color="black" if bright else "white")
        ax.set_title(names[k].replace("_", " "), fontsize=9)
        ax.set_xlabel("head", fontsize=7)
        ax.set_ylabel("layer", fontsize=7)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(title, fontsize=10)
    _quiet_layout(fig, path, top=1.0 - 0.6 / fig.get_figheight())
