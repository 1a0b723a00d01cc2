"""PyTorch's fused attention kernel (model/fused_attention.py), which export's reference pass uses where no maps
are wanted, gives the hidden states the written-out attention gives, on every attention module that declares it:
BERT's (key padding), MPNet's (a relative position bias in the mask), Qwen3's (grouped keys, causal, rotary); and
it is never used where maps are asked for, nor in a trace."""

from __future__ import annotations

import pytest
import torch

from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.model.fused_attention import fused_attention

from .checkpoints import save_tiny_family
from .family_parity import padded_batch
from .tiny_qwen3 import save_tiny_qwen3

LENGTHS = (40, 17, 1, 33)


@pytest.fixture(scope="module", params=["bert", "mpnet", "qwen3"])
def encoder(request, tmp_path_factory) -> torch.nn.Module:
    root = tmp_path_factory.mktemp(request.param)
    model = (save_tiny_qwen3(root / "model") if request.param == "qwen3"
             else save_tiny_family(root / "model", request.param))
    return load_encoder(read_checkpoint(model)).eval()


def _declared(encoder: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in encoder.modules() if hasattr(type(m), "fused_attention")]


def test_the_fused_kernel_gives_the_written_out_hidden_states(encoder):
    cfg = encoder.config
    ids, mask = padded_batch(LENGTHS, cfg.vocab_size, cfg.pad_token_id, seed=5)
    assert _declared(encoder), "the family's attention declares fused_attention"
    with torch.no_grad():
        written, maps = encoder(ids, mask, True)
        with fused_attention(encoder):
            assert all(m.fused_attention for m in _declared(encoder))
            fused, none = encoder(ids, mask, False)
    assert none is None and maps is not None
    real = mask.bool()
    assert float((written[real] - fused[real]).abs().max()) <= 1e-5
    assert not any(m.fused_attention for m in _declared(encoder))  # switched off on leaving


def test_a_trace_takes_the_written_out_form_even_inside_the_switch(encoder):
    cfg = encoder.config
    ids, mask = padded_batch((9, 5), cfg.vocab_size, cfg.pad_token_id, seed=6)

    class Hidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids, mask):
            return self.inner(ids, mask, False)[0]

    with torch.no_grad(), fused_attention(encoder):
        traced = torch.jit.trace(Hidden(encoder), (ids, mask), check_trace=False)
    kinds = {node.kind() for node in traced.inlined_graph.nodes()}
    assert "aten::softmax" in kinds and "aten::scaled_dot_product_attention" not in kinds
