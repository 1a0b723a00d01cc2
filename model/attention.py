"""The one attention core under every family: softmax(Q K^T / sqrt(d) + mask) V per head, then W_O.

Each family's attention module computes its queries, keys and values its own way (one projection or three,
rotary or absolute positions, a norm per head, grouped key/value heads) and hands them to SelfAttention.attend,
which is the same for all of them:
- the softmax is written out, so that the maps it makes are the maps the attention graph returns (they are the
  product) and the shape onnxruntime's optimizer recognises and fuses in the embeddings graph: the scores are
  divided by sqrt(d), as BERT writes it, since the fusion takes the first Mul above the mask's Add for the mask's
  (a scale multiplied in there left BERT's six layers unfused);
- outside a trace, a forward that wants no maps may take PyTorch's fused kernel instead (fused_attention.py);
- each head's value norms are kept where asked (value_norms.py);
- a family may soft-cap the scores before the mask (Gemma 2: softcap * tanh(scores / softcap)), in the same place
  for every graph and map.

Shapes: B batch, T sequence, nh query heads, nkv key/value heads (dividing nh), hs head size, H hidden.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .fused_attention import fused, fused_context
from .value_norms import kept_value_norms


def repeat_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, nkv, T, hs) -> (B, nh, T, hs): key/value head j serves query heads j*g .. j*g + g - 1 (g = nh / nkv)."""
    B, nkv, T, hs = x.shape
    g = num_heads // nkv
    return x if g == 1 else x[:, :, None].expand(B, nkv, g, T, hs).reshape(B, nkv * g, T, hs)


def weighted_values(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                    divisor: float, softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The written-out softmax every attention here runs: q (B, nh, Tq, hs), keys and values (B, nh, Tk, hs), mask
    additive and broadcastable to (B, nh, Tq, Tk) (None: every key). Returns the heads (B, nh, Tq, hs) and the
    maps (B, nh, Tq, Tk). Tk differs from Tq in a cross-attention (NV-Embed's latent attention: model/nvembed.py)."""
    scores = torch.matmul(q, keys.transpose(-1, -2)) / divisor  # (B, nh, Tq, Tk)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    probs = F.softmax(scores if mask is None else scores + mask, dim=-1)  # (B, nh, Tq, Tk), each row sums to 1
    return torch.matmul(probs, values), probs  # (B, nh, Tq, hs)


class SelfAttention(nn.Module):
    """What every family's attention module is: its subclass sets nh, divisor and out (W_O) and calls attend()
    with its queries, keys and values."""

    keep_value_norms = False  # set for a forward with attention outputs (value_norms.py)
    fused_attention = False  # set for a forward that wants no maps (fused_attention.py)
    nh: int  # query heads
    divisor: float  # the scores': sqrt(hs), but where a family says otherwise (Gemma 3's query_pre_attn_scalar)
    out: nn.Linear  # W_O: (nh * hs) -> H
    # Gemma 2's attn_logit_softcapping: the scores become softcap * tanh(scores / softcap) before the mask is added,
    # as transformers' eager attention does (the fused kernel has no such step: it is not taken then). None: none.
    softcap: float | None = None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q: (B, nh, T, hs); k, v: (B, nkv, T, hs); mask: additive, 0 for keys attended to and a large negative
        for the others, broadcastable to (B, nh, T, T). Returns W_O(the heads concatenated) (B, T, H) and the maps
        (B, nh, T, T), None from the fused kernel."""
        B, nh, T, hs = q.shape
        keys, values = repeat_heads(k, nh), repeat_heads(v, nh)  # (B, nh, T, hs) each
        probs: torch.Tensor | None = None
        if self.softcap is None and fused(self):  # the same function, no (T, T) maps held
            heads = fused_context(q, keys, values, mask, 1 / self.divisor)  # (B, nh, T, hs)
        else:
            heads, probs = weighted_values(q, keys, values, mask, self.divisor, self.softcap)
        context = heads.transpose(1, 2).reshape(B, T, nh * hs)  # heads concatenated
        self.value_norms = kept_value_norms(self, v, self.out.weight, nh)  # (B, nh, T)
        return self.out(context), probs
