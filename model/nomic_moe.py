"""nomic-embed-text-v2-moe: NomicBERT (model_type nomic_bert) with a mixture of experts in place of every n-th
layer's feed-forward, as its published modelling code runs it (nomic's modeling_hf_nomic_bert.py, the file its
config.json's auto_map names; a copy is tests/reference/nomic_moe/, the tests' reference).

That code makes the encoder one of mixtures when its config gives moe_every_n_layers > 0, and then layer i is a
mixture when i % moe_every_n_layers == 1 (layers 1, 3, 5, ... for nomic-embed-text-v2-moe's 2); nomic_bert.py
sends such a config here. Everything else is the rotary BERT layout of rotary_bert.py (post-LayerNorm layers,
normalised embeddings, rotary positions, query, key and value from one biased projection), with BERT's plain
feed-forward in the other layers: fc2(gelu(fc1(x))), both biased, gelu the exact one whatever gelu the config
names (the code runs F.gelu for each).

A mixture (NomicMoELayer, without megablocks: its CPU path, which this module follows step by step):
- the router, a Linear H -> E without bias, softmax over all E experts in fp32, then the top k probabilities;
  they are not renormalised (the code's router is built without moe_normalize_expert_weights), so a token's two
  weights sum to less than 1;
- expert e is gelu(x @ w1[e]^T) @ w2[e], w1 and w2 each (E * F, H) with expert e's rows at e*F .. (e+1)*F, no
  bias of its own;
- a token's output is the sum of its k experts' outputs, each times its weight, added into zeros in the order of
  the experts' index, plus one bias (H,) shared by all experts.

Config.json is read as that code reads it: the remote code's names (n_embd, n_layer, n_head, n_inner,
n_positions, layer_norm_epsilon, rotary_emb_base; hidden_size, num_hidden_layers, num_attention_heads and
max_position_embeddings are GPT2Config's aliases of the first four), a missing setting at that code's default
(NomicBertConfig's over GPT2Config's: no rotary, layer_norm_epsilon 1e-5, rotary base 10000, two token types).

Shapes: B batch, T sequence, N = B*T tokens, H hidden, E experts, k experts a token is routed to, F an expert's
feed-forward size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnserve.errors import CheckpointError

from .config_reading import check_architectures, check_object, check_settings, check_supported, invalid_config
from .rotary import default_inv_freq
from .rotary_bert import PlainFeedForward, RotaryBertConfig, RotaryBertEncoder, check_sizes

ENCODER_ARCHITECTURES = ("NomicBertModel",)
# The module auto_map's AutoModel names (nomic-embed-text-v2-moe's: "nomic-ai/nomic-bert-2048--" before it).
REMOTE_CODE = "modeling_hf_nomic_bert.NomicBertModel"
# Our config field -> (the keys the remote code reads it under, its default there: GPT2Config's or
# NomicBertConfig's). None: no default (n_inner None breaks the experts, which are built with it).
SIZES: dict[str, tuple[tuple[str, ...], Any]] = {
    "vocab_size": (("vocab_size",), 50257),
    "hidden_size": (("n_embd", "hidden_size"), 768),
    "num_layers": (("n_layer", "num_hidden_layers"), 12),
    "num_heads": (("n_head", "num_attention_heads"), 12),
    "intermediate_size": (("n_inner",), None),
    "max_position_embeddings": (("n_positions", "max_position_embeddings"), 1024),
    "type_vocab_size": (("type_vocab_size",), 2),
    "layer_norm_eps": (("layer_norm_epsilon",), 1e-5),
    "rope_theta": (("rotary_emb_base",), 10_000),
    "num_experts": (("num_experts",), None),
    "top_k": (("moe_top_k",), None),
}
# The remote code's settings at the values this module runs, and each one's default there (a missing key reads as
# that default). rotary_emb_fraction below 1 rotates part of each head (0: learned positions instead);
# interleaved rotates pairs, scale_base is xPos, rotary_scaling_factor dynamic NTK; the rest change the layer's
# layout. moe_normalize_expert_weights, num_shared_experts and expert_choice_router are not read by the code's
# CPU mixture (megablocks' would normalise): a checkpoint trained with them is not what it runs, so refused.
# Irrelevant to the outputs, and accepted as they are: dropout, use_flash_attn, fused_bias_fc,
# fused_dropout_add_ln, max_trained_positions, moe_impl, router_aux_loss_coef. pad_vocab_size_multiple rounds
# vocab_size up to a multiple of it, as the code's NomicBertModel does before building its embedding.
REPRODUCED: dict[str, tuple[Any, Any]] = {
    "rotary_emb_fraction": (1.0, 0.0), "rotary_emb_interleaved": (False, False),
    "rotary_emb_scale_base": (None, None), "rotary_scaling_factor": (None, None), "prenorm": (False, False),
    "parallel_block": (False, False), "use_rms_norm": (False, False), "causal": (False, False),
    "mlp_fc1_bias": (True, True), "mlp_fc2_bias": (True, True),
    "moe_normalize_expert_weights": (False, False), "num_shared_experts": (0, 0),
    "expert_choice_router": (False, False),
}


# The remote code's activation_function values without a gate: it runs exact gelu (F.gelu) for each of them, in
# the dense layers and the experts alike; a missing one is GPT2Config's gelu_new. Gated ones (glu, swiglu, geglu)
# it runs gated in the dense layers but not in its CPU experts (megablocks' would gate): refused.
GELUS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class NomicMoeConfig(RotaryBertConfig):
    num_experts: int  # E
    top_k: int  # k: the experts each token is routed to
    moe_every_n_layers: int

    def is_moe_layer(self, i: int) -> bool:
        """The remote code's rule (NomicBertEncoder): layer i is a mixture when i % moe_every_n_layers == 1."""
        return i % self.moe_every_n_layers == 1


def moe_every_n_layers(raw: dict[str, Any], path: Path) -> int:
    """config.json's moe_every_n_layers, 0 when missing; above 0 the remote code builds mixtures."""
    n = raw.get("moe_every_n_layers", 0)
    if isinstance(n, bool) or not isinstance(n, int):
        raise CheckpointError(f"{path}: invalid config: moe_every_n_layers must be a whole number, got {n!r}")
    return n


def read_config(raw: dict[str, Any], path: Path) -> NomicMoeConfig:
    """config.json of a NomicBERT with mixtures (moe_every_n_layers > 0), or a one-line refusal of what this
    module does not run; no weight is read."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES)
    check_object(raw.get("auto_map"), path, "auto_map")
    remote = (raw.get("auto_map") or {}).get("AutoModel")
    if remote is not None and (not isinstance(remote, str) or not remote.endswith(REMOTE_CODE)):
        raise CheckpointError(f"{path}: cannot reproduce auto_map's AutoModel {remote!r} (only nomic's "
                              f"{REMOTE_CODE})")
    check_settings({k: raw.get(k, default) for k, (_, default) in REPRODUCED.items()}, path,
                   {k: value for k, (value, _) in REPRODUCED.items()})
    check_supported(path, "activation_function", raw.get("activation_function", "gelu_new"), GELUS)
    with invalid_config(path):
        values = {field: _value(raw, keys, default, path) for field, (keys, default) in SIZES.items()}
        for field in ("intermediate_size", "num_experts", "top_k"):
            if values[field] is None:
                raise CheckpointError(f"{path}: missing field {SIZES[field][0][0]!r} (the mixture of experts "
                                      "needs it)")
            if not isinstance(values[field], int):
                raise CheckpointError(f"{path}: invalid config: {SIZES[field][0][0]} must be a whole number, got "
                                      f"{values[field]!r}")
        hidden, heads = int(values["hidden_size"]), int(values["num_heads"])
        if heads < 1 or hidden % heads:
            raise CheckpointError(f"{path}: invalid config: n_embd {hidden} is not a multiple of n_head {heads}")
        qkv_bias = raw.get("qkv_proj_bias", True)
        if not isinstance(qkv_bias, bool):
            raise CheckpointError(f"{path}: qkv_proj_bias must be true or false, got {qkv_bias!r}")
        multiple = raw.get("pad_vocab_size_multiple") or 1
        if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
            raise CheckpointError(f"{path}: invalid config: pad_vocab_size_multiple must be a positive whole "
                                  f"number, got {multiple!r}")
        vocab = -(-int(values["vocab_size"]) // multiple) * multiple  # rounded up to the multiple
        cfg = NomicMoeConfig(
            vocab_size=vocab, hidden_size=hidden, num_layers=int(values["num_layers"]),
            num_heads=heads, head_size=hidden // heads, intermediate_size=int(values["intermediate_size"]),
            max_position_embeddings=int(values["max_position_embeddings"]),
            type_vocab_size=int(values["type_vocab_size"]), layer_norm_eps=float(values["layer_norm_eps"]),
            pad_token_id=int(raw.get("pad_token_id") or 0), activation="gelu",
            rope_theta=float(values["rope_theta"]), ntk_factor=1.0, qkv_bias=qkv_bias, out_bias=qkv_bias,
            up_bias=True, down_bias=True, family="nomic_bert", num_experts=int(values["num_experts"]),
            top_k=int(values["top_k"]), moe_every_n_layers=moe_every_n_layers(raw, path))
    check_sizes(cfg, path)
    if cfg.num_experts < 1 or not 1 <= cfg.top_k <= cfg.num_experts:
        raise CheckpointError(f"{path}: invalid config: num_experts must be at least 1 and moe_top_k from 1 to "
                              f"num_experts, got {cfg.num_experts} and {cfg.top_k}")
    return cfg


def _value(raw: dict[str, Any], keys: tuple[str, ...], default: Any, path: Path) -> Any:
    """A setting under the remote code's name or GPT2Config's alias of it; both given, they must agree."""
    given = {k: raw[k] for k in keys if raw.get(k) is not None}
    if any(v != next(iter(given.values())) for v in given.values()):
        raise CheckpointError(f"{path}: {' and '.join(f'{k} {v!r}' for k, v in given.items())} disagree")
    value = next(iter(given.values()), default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value)):
        raise CheckpointError(f"{path}: invalid config: {keys[0]} must be a number, got {value!r}")
    return value


class MixtureOfExperts(nn.Module):
    """The remote code's NomicMoELayer (router, experts, shared bias), exported as it computes.

    In the graph: the router's TopK, then for each expert (a loop of E unrolled at tracing: E is the config's)
    NonZero finds the tokens routed to it, Gather takes them, two MatMuls and the gelu run on those tokens alone,
    and ScatterND adds the weighted outputs into the tokens' rows. Each token thus costs k experts' work, not E's
    (a dense formulation, every expert on every token weighted by a mostly-zero gate, would be the same sums with
    exact zeros added, at E/k times the experts' work: 4x for 8 experts, top 2). A token's sum is the reference's:
    its k terms added into zeros in the order of the experts' index."""

    def __init__(self, cfg: NomicMoeConfig):
        super().__init__()
        self.num_experts, self.top_k, self.ffn = cfg.num_experts, cfg.top_k, cfg.intermediate_size
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)  # router.layer
        self.w1 = nn.Parameter(torch.empty(cfg.num_experts * cfg.intermediate_size, cfg.hidden_size))  # (E*F, H)
        self.w2 = nn.Parameter(torch.empty(cfg.num_experts * cfg.intermediate_size, cfg.hidden_size))  # (E*F, H)
        self.bias = nn.Parameter(torch.empty(cfg.hidden_size))  # (H,) added once, after the experts' sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        tokens = x.reshape(B * T, H)  # (N, H): padded tokens are routed too, as the reference routes them
        probs = self.router(tokens).softmax(dim=-1, dtype=torch.float32)  # (N, E)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # (N, k) each, not renormalised
        weights = weights.to(x.dtype)
        w1 = self.w1.view(self.num_experts, self.ffn, H)  # (E, F, H)
        w2 = self.w2.view(self.num_experts, self.ffn, H)  # (E, F, H)
        out = torch.zeros_like(tokens)  # (N, H)
        for e in range(self.num_experts):
            # A token chooses an expert at most once, so each token appears once among its rows here.
            token, slot = torch.nonzero(chosen == e, as_tuple=True)  # (n_e,) each
            routed = F.gelu(tokens[token] @ w1[e].t()) @ w2[e]  # (n_e, F) -> (n_e, H)
            out = out.index_put((token,), routed * weights[token, slot].unsqueeze(-1), accumulate=True)
        return (out + self.bias).view(B, T, H)


def feed_forward(cfg: NomicMoeConfig, i: int) -> nn.Module:
    return MixtureOfExperts(cfg) if cfg.is_moe_layer(i) else PlainFeedForward(
        cfg.hidden_size, cfg.intermediate_size, cfg.activation)


def build(cfg: NomicMoeConfig) -> nn.Module:
    return RotaryBertEncoder(cfg, feed_forward, default_inv_freq(cfg.head_size, cfg.rope_theta))


def key_map(cfg: NomicMoeConfig) -> dict[str, str]:
    """Checkpoint key (the remote code's naming) -> RotaryBertEncoder key."""
    keys = {"embeddings.word_embeddings.weight": "word.weight",
            "emb_ln.weight": "embeddings_norm.weight", "emb_ln.bias": "embeddings_norm.bias"}
    if cfg.type_vocab_size:
        keys["embeddings.token_type_embeddings.weight"] = "token_type.weight"
    attention = {"attn.Wqkv.weight": "attention.qkv.weight", "attn.out_proj.weight": "attention.out.weight",
                 "norm1.weight": "attention_norm.weight", "norm1.bias": "attention_norm.bias",
                 "norm2.weight": "output_norm.weight", "norm2.bias": "output_norm.bias"}
    if cfg.qkv_bias:
        attention |= {"attn.Wqkv.bias": "attention.qkv.bias", "attn.out_proj.bias": "attention.out.bias"}
    dense = {"mlp.fc1.weight": "feed_forward.up.weight", "mlp.fc1.bias": "feed_forward.up.bias",
             "mlp.fc2.weight": "feed_forward.down.weight", "mlp.fc2.bias": "feed_forward.down.bias"}
    mixture = {"mlp.router.layer.weight": "feed_forward.router.weight", "mlp.experts.mlp.w1": "feed_forward.w1",
               "mlp.experts.mlp.w2": "feed_forward.w2", "mlp.experts.bias": "feed_forward.bias"}
    for i in range(cfg.num_layers):
        per_layer = attention | (mixture if cfg.is_moe_layer(i) else dense)
        keys |= {f"encoder.layers.{i}.{theirs}": f"layers.{i}.{ours}" for theirs, ours in per_layer.items()}
    return keys
