"""bge-m3's two heads beside its dense embedding, as FlagEmbedding's BGEM3FlagModel computes them: a checkpoint with
colbert_linear.pt and sparse_linear.pt at its root (torch state dicts of a Linear(H, d) and a Linear(H, 1)).

The export copies their weights into the artifacts as arrays (ARTIFACT) with the ids that the sparse output leaves
out (the tokenizer's cls, eos, pad and unk tokens, as FlagEmbedding leaves them out); the engine applies them to the
encoder's last hidden state in numpy (engine/bge_m3.py), from the same pass that gives the dense embedding: a
matrix product per token, under half a percent of the encoder's work.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnserve.errors import CheckpointError

HEAD_FILES = ("colbert_linear.pt", "sparse_linear.pt")
ARTIFACT = "bge_m3_heads.npz"


def has_heads(directory: Path) -> bool:
    """Both of bge-m3's head files are there (one alone is a checkpoint FlagEmbedding itself would not load)."""
    return all((directory / name).is_file() for name in HEAD_FILES)


def save_heads(checkpoint: Path, out: Path, hidden_size: int) -> dict:
    """The heads' weights as arrays in out/ARTIFACT; returns the manifest's "bge_m3" entry (without its sha256)."""
    import torch
    from transformers import AutoTokenizer

    arrays = {}
    for name, prefix, rows in (("colbert_linear.pt", "colbert", None), ("sparse_linear.pt", "sparse", 1)):
        path = checkpoint / name
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many kinds for a file that is not a state dict
            raise CheckpointError(f"{path}: not a torch state dict: {e}") from None
        weight, bias = (state.get(key) if isinstance(state, dict) else None for key in ("weight", "bias"))
        if not (isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor) and weight.ndim == 2
                and weight.shape[1] == hidden_size and bias.shape == (weight.shape[0],)
                and (rows is None or weight.shape[0] == rows)):
            raise CheckpointError(f"{path}: expected a Linear({hidden_size}, {rows or 'd'})'s weight and bias")
        arrays[f"{prefix}_weight"] = weight.float().numpy()
        arrays[f"{prefix}_bias"] = bias.float().numpy()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    unused = sorted({i for i in (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                 tokenizer.unk_token_id) if i is not None})
    np.savez(out / ARTIFACT, colbert_weight=arrays["colbert_weight"], colbert_bias=arrays["colbert_bias"],
             sparse_weight=arrays["sparse_weight"], sparse_bias=arrays["sparse_bias"])
    return {"file": ARTIFACT, "colbert_dim": int(arrays["colbert_weight"].shape[0]), "unused_ids": unused}
