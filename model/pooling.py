"""sentence-transformers' Pooling in torch, for the exported graph: every mode, alone or several concatenated.

Each mode matches sentence-transformers 6.2's Pooling on right-padded inputs (the only padding the engine
makes), and lasttoken on left-padded ones too (Qwen3-Embedding's tokenizer pads left); the numpy twin for
request-time pooling is engine/pooling.py (right padding only: it takes lengths), and a test checks that they agree.
Shapes: B batch, T sequence, H hidden.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnserve.pooling_modes import POOLING_MODES


def pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor, mode: str, pads_zeroed: bool = False
         ) -> torch.Tensor:
    """(B, T, H), (B, T) mask 1 for real tokens -> (B, H), padding excluded. pads_zeroed: the states are zeros at
    padding (Pipeline.pads_zeroed), so the mean needs no product with the mask."""
    B, T, H = last_hidden_state.shape
    if mode == "cls":
        return last_hidden_state[:, 0]
    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)  # (B, T, 1)
    if mode == "lasttoken":
        # The last real token's position whichever side is padded (the engine pads right, Qwen3's tokenizer left).
        positions = torch.arange(T, device=attention_mask.device, dtype=attention_mask.dtype)
        last = (attention_mask * positions).amax(dim=1).view(B, 1, 1).expand(B, 1, H)  # (B, 1, H)
        return torch.gather(last_hidden_state, 1, last).squeeze(1)
    if mode == "max":
        return last_hidden_state.masked_fill(mask == 0, float("-inf")).max(dim=1).values
    if mode == "weightedmean":
        positions = torch.arange(1, T + 1, device=last_hidden_state.device, dtype=last_hidden_state.dtype)
        weights = mask * positions.view(1, T, 1)  # (B, T, 1): position + 1 on real tokens, 0 on padding
        return (last_hidden_state * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    assert mode in ("mean", "mean_sqrt_len_tokens"), f"unknown pooling mode {mode!r}"
    summed = (last_hidden_state if pads_zeroed else last_hidden_state * mask).sum(dim=1)  # (B, H)
    counts = mask.sum(dim=1).clamp(min=1e-9)  # (B, 1)
    return summed / (counts if mode == "mean" else counts.sqrt())


class Pooling(nn.Module):
    """Several modes' outputs concatenated in the order given: (B, T, H), (B, T) -> (B, len(modes) * H)."""

    def __init__(self, modes: tuple[str, ...], pads_zeroed: bool = False):
        super().__init__()
        assert modes and all(m in POOLING_MODES for m in modes), f"pooling modes must be from {POOLING_MODES}"
        self.modes, self.pads_zeroed = modes, pads_zeroed

    def forward(self, last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled = [pool(last_hidden_state, attention_mask, mode, self.pads_zeroed) for mode in self.modes]
        return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=-1)
