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
