"""Each head's value-vector norms (Kobayashi et al., EMNLP 2020, "Attention is not only a weight"): the norm of
token j's value vector through head h's slice of W_O, ||f_h(x_j)|| with f_h(x) = (x W_V^h + b_V^h) W_O^h. Weighted
by the attention, ||a_ij f_h(x_j)|| = a_ij ||f_h(x_j)||: how much of token j actually reaches token i through head
h, which a weight alone does not say (a large weight on a token whose transformed vector is small moves little).

Every family's attention module computes them in its forward where asked (kept_value_norms below, kept as its
`value_norms`), and SentenceEncoder returns them, (L, B, nh, T), as the attention graph's `value_norms` output.
Only where asked (keep_value_norms: a forward with attention outputs): their product is (B, nh, T, H) a layer, nh
times the hidden state, and the embeddings' forwards (PyTorch's reference, the trace of the embeddings graph) held
it for nothing: a 17-row case of 64 tokens took 0.16 GB more for all-mpnet-base-v2's reference.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def value_norms(v: torch.Tensor, out_weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """v: (B, n, T, hs) the value vectors of n heads (n divides num_heads: grouped key/value heads serve
    num_heads / n query heads each); out_weight: W_O, (H, num_heads * hs) as nn.Linear stores it.
    Returns (B, num_heads, T): ||v_j^h W_O^h|| per head h and token j."""
    B, n, T, hs = v.shape
    if n != num_heads:  # (B, n, T, hs) -> (B, nh, T, hs): key/value head j serves query heads j*g .. j*g + g - 1
        v = v[:, :, None].expand(B, n, num_heads // n, T, hs).reshape(B, num_heads, T, hs)
    w = out_weight.reshape(out_weight.shape[0], num_heads, hs).permute(1, 2, 0)  # (nh, hs, H): W_O^h
    return torch.matmul(v, w).norm(dim=-1)  # (B, nh, T, H) -> (B, nh, T)


def kept_value_norms(attention: nn.Module, v: torch.Tensor, out_weight: torch.Tensor, num_heads: int
                     ) -> torch.Tensor | None:
    """value_norms (B, nh, T) where the attention module's forward is asked for them (keep_value_norms), else
    None. An attention module declares `keep_value_norms = False` as a class attribute."""
    return value_norms(v, out_weight, num_heads) if getattr(attention, "keep_value_norms", False) else None


def keep_value_norms(encoder: nn.Module, keep: bool) -> None:
    """Whether the encoder's attention modules compute their value norms in the forwards that follow (those with
    attention outputs: stacked_value_norms reads them after)."""
    for module in encoder.modules():
        if hasattr(type(module), "keep_value_norms"):
            module.keep_value_norms = keep  # type: ignore[assignment]


def stacked_value_norms(encoder: nn.Module) -> torch.Tensor:
    """(L, B, nh, T): the value norms its attention modules kept in the forward just run, in layer order."""
    norms = [getattr(m, "value_norms", None) for m in encoder.modules() if hasattr(type(m), "keep_value_norms")]
    if not norms:
        raise TypeError(f"{type(encoder).__name__}'s attention modules keep no value norms")
    kept = [norm for norm in norms if norm is not None]
    if len(kept) < len(norms):
        raise RuntimeError("the forward just run kept no value norms: keep_value_norms(encoder, True) first")
    return torch.stack(kept)
