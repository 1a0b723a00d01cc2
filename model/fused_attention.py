"""PyTorch's fused attention kernel for the forwards that return no attention maps: export's reference pass.

Every family's attention module defines attention as written out, softmax(Q K^T * scale + mask) V, with its maps
(B, nh, T, T) in hand: that is what the traced graphs and the attention outputs are made of. A forward that only
wants hidden states (PyTorch's reference for the embeddings graphs, export/verify.py) need not materialise those
maps: torch's scaled_dot_product_attention computes the same function in blocks, never holding a (T, T) score
matrix. For the Qwen3-Embedding-0.6B shape's 3,344-token check rows, each layer's scores take 716 MB a copy, and
the written-out form made several; the reference pass was half of that model's first export.

Off by default and outside a trace: the graphs are traced from the written-out form, whose shape onnxruntime's
optimizer recognises and fuses itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F


def fused(attention: nn.Module) -> bool:
    """Whether the attention module's forward may use the fused kernel now (no maps wanted, not tracing)."""
    return getattr(attention, "fused_attention", False) and not torch.jit.is_tracing()


def fused_context(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
                  ) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v by the fused kernel. q, k, v: (B, nh, T, hs); mask: additive, broadcastable
    to (B, nh, T, T). Returns (B, nh, T, hs)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=scale)


@contextlib.contextmanager
def fused_attention(encoder: nn.Module, on: bool = True) -> Iterator[None]:
    """Within it, the encoder's attention modules that declare `fused_attention` use the fused kernel (`on`)."""
    modules = [m for m in encoder.modules() if hasattr(type(m), "fused_attention")]
    for module in modules:
        module.fused_attention = on  # type: ignore[assignment]
    try:
        yield
    finally:
        for module in modules:
            module.fused_attention = False  # type: ignore[assignment]
