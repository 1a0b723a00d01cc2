"""The building blocks of the Llama-style families (Qwen3, Gemma 3, EuroBERT): RMSNorm, grouped-query attention
with rotary positions, the gated feed-forward, the pre-norm layer made of them and the encoder around it (Qwen3,
EuroBERT; Gemma 3 uses the layer with its sandwich norms and its own encoder).

Shapes: B batch, T sequence, H hidden, nh query heads, nkv key/value heads (nh a multiple of it), hs head size,
F feed-forward size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import SelfAttention
from .attention_reach import EVERY_KEY, Reach, causal_within
from .encoder import MASK_VALUE
from .family import ModelConfig, NoTokenTypes
from .rotary import RotaryEmbedding, RotaryPositions, default_inv_freq, rotate


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, in fp32 as transformers computes it. Gemma stores weight - 1
    (unit_offset: the scale is 1 + weight, and a fresh weight is zeros)."""

    def __init__(self, size: int, eps: float, unit_offset: bool = False):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.weight = nn.Parameter(torch.zeros(size) if unit_offset else torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., size)
        return x * (1.0 + self.weight if self.unit_offset else self.weight)


# config.json's hidden_act names, as transformers' ACT2FN maps them.
GATE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "swish": F.silu, "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


class GatedFeedForward(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with silu (Qwen3, EuroBERT), GeGLU-tanh with gelu_pytorch_tanh (Gemma 3)."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str, bias: bool = False):
        super().__init__()
        self.gate = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.activation = GATE_ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.gate(x)) * self.up(x))  # (B, T, H)


class GroupedQueryAttention(SelfAttention):
    """Self-attention with nkv key/value heads shared by groups of nh / nkv query heads, rotary positions and,
    where the family has it, an RMSNorm over each query and key head before the rotation (Qwen3, Gemma 3).

    The attention maps are returned per query head, (B, nh, T, T): a key/value head's keys are the same for
    every query head of its group, but each query head weighs them its own way."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_size: int, bias: bool,
                 divisor: float, head_norm: RMSNorm | None = None, out_bias: bool | None = None):
        super().__init__()
        assert num_heads % num_kv_heads == 0, "query heads must split evenly into key/value groups"
        self.nh, self.nkv, self.hs, self.divisor = num_heads, num_kv_heads, head_size, divisor
        self.query = nn.Linear(hidden_size, num_heads * head_size, bias=bias)
        self.key = nn.Linear(hidden_size, num_kv_heads * head_size, bias=bias)
        self.value = nn.Linear(hidden_size, num_kv_heads * head_size, bias=bias)
        self.out = nn.Linear(num_heads * head_size, hidden_size, bias=bias if out_bias is None else out_bias)  # W_O
        # One norm's weights for every query head and one for every key head, as transformers has them.
        self.query_norm = head_norm
        self.key_norm = None if head_norm is None else RMSNorm(head_size, head_norm.eps, head_norm.unit_offset)

    def _heads(self, x: torch.Tensor, n: int, norm: RMSNorm | None) -> torch.Tensor:
        B, T, _ = x.shape
        x = x.view(B, T, n, self.hs)  # (B, T, n, hs)
        return (x if norm is None else norm(x)).transpose(1, 2)  # (B, n, T, hs)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H); mask: additive, broadcastable to (B, nh, T, T); cos, sin: (T, hs). Returns the output
        and the maps (None from the fused kernel: attention.py)."""
        q = rotate(self._heads(self.query(x), self.nh, self.query_norm), cos, sin)  # (B, nh, T, hs)
        k = rotate(self._heads(self.key(x), self.nkv, self.key_norm), cos, sin)  # (B, nkv, T, hs)
        v = self._heads(self.value(x), self.nkv, None)  # (B, nkv, T, hs)
        return self.attend(q, k, v, mask)


def padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1 for real tokens -> (B, 1, 1, T) additive: 0 for real keys, MASK_VALUE for padded ones."""
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * MASK_VALUE


def causal_mask(T: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(T, T) additive: MASK_VALUE where the key comes after the query."""
    positions = torch.arange(T, device=device)
    return (positions[None, :] > positions[:, None]).to(dtype) * MASK_VALUE


def window_mask(T: int, half_window: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(T, T) additive: MASK_VALUE where the key is more than half_window positions from the query, on either side."""
    positions = torch.arange(T, device=device)
    return ((positions[None, :] - positions[:, None]).abs() > half_window).to(dtype) * MASK_VALUE


def behind_window_mask(T: int, window: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(T, T) additive: MASK_VALUE where the key is window or more positions before the query (transformers'
    sliding-window causal mask keeps query - key < window)."""
    positions = torch.arange(T, device=device)
    return (positions[:, None] - positions[None, :] >= window).to(dtype) * MASK_VALUE


def windowed_mask(padding: torch.Tensor, outside_window: torch.Tensor) -> torch.Tensor:
    """The additive mask of a layer that attends within a window (Gemma 3's sliding layers, ModernBERT's local ones):
    padding (B, 1, 1, T) from padding_mask, outside_window (T, T) -> (B, 1, T, T).

    Padding counts twice: a padded query whose window holds only padding still has the real keys outside it to
    prefer, so padded keys get exactly 0 weight from every query. A real query's window always holds the query
    itself, so both kinds of masked keys get exactly 0 there."""
    return 2 * padding + outside_window


# The sizes a Llama-style config must give as positive integers (config_reading.check_positive).
LLAMA_STYLE_SIZES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_size",
                     "intermediate_size", "max_position_embeddings")


class LlamaStyleConfig(RotaryPositions, NoTokenTypes):
    """Base of the Llama-style configs (Qwen3Config, EuroBertConfig, Gemma3Config): the checks they share; none has
    token types."""

    num_heads: int
    num_kv_heads: int
    head_size: int

    def __post_init__(self) -> None:
        assert self.num_heads % self.num_kv_heads == 0, "num_attention_heads must be a multiple of num_key_value_heads"
        assert self.head_size % 2 == 0, "rotary embeddings need an even head_dim"


class LlamaStyleSizes(ModelConfig, Protocol):
    """The config fields a pre-norm layer and encoder read (Qwen3Config, EuroBertConfig, Gemma3Config)."""

    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_size(self) -> int: ...
    @property
    def rms_norm_eps(self) -> float: ...
    @property
    def attention_bias(self) -> bool: ...


class PreNormLayer(nn.Module):
    """Llama's layer order: x = x + attention(attention_norm(x)); x = x + feed_forward(feed_forward_norm(x)).
    The residual stream itself is never normalised here. With sandwich (Gemma 3) each sublayer's output is
    normalised again before the residual sum (post_attention_norm, post_feed_forward_norm).

    divisor: the attention scores' (attention.py), sqrt(head size) but for Gemma 3; head_norm: an RMSNorm over
    each query and key head before the rotation (Qwen3, Gemma 3); unit_offset: every norm scales by 1 + weight
    (Gemma); mlp_bias: biases in the feed-forward (EuroBERT's and Llama's option); out_bias: W_O's bias where it
    differs from the queries', keys' and values' (Qwen2: theirs, not W_O's; None: the same)."""

    def __init__(self, cfg: LlamaStyleSizes, activation: str, divisor: float, head_norm: bool = False,
                 mlp_bias: bool = False, unit_offset: bool = False, sandwich: bool = False,
                 out_bias: bool | None = None):
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.attention_norm = RMSNorm(H, eps, unit_offset)  # input_layernorm
        self.attention = GroupedQueryAttention(
            H, cfg.num_heads, cfg.num_kv_heads, cfg.head_size, cfg.attention_bias, divisor,
            head_norm=RMSNorm(cfg.head_size, eps, unit_offset) if head_norm else None, out_bias=out_bias)
        self.post_attention_norm = RMSNorm(H, eps, unit_offset) if sandwich else None
        # post_attention_layernorm (Qwen3, EuroBERT) or pre_feedforward_layernorm (Gemma 3): before the feed-forward
        self.feed_forward_norm = RMSNorm(H, eps, unit_offset)
        self.feed_forward = GatedFeedForward(H, cfg.intermediate_size, activation, bias=mlp_bias)
        self.post_feed_forward_norm = RMSNorm(H, eps, unit_offset) if sandwich else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, probs = self.attention(self.attention_norm(x), mask, cos, sin)
        if self.post_attention_norm is not None:
            attended = self.post_attention_norm(attended)
        x = x + attended  # (B, T, H)
        fed = self.feed_forward(self.feed_forward_norm(x))
        if self.post_feed_forward_norm is not None:
            fed = self.post_feed_forward_norm(fed)
        x = x + fed  # (B, T, H)
        return x, probs


def run_layers(layers: Iterable[nn.Module], x: torch.Tensor, output_attentions: bool,
               inputs: Callable[[nn.Module], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x through each layer, layer(x, *inputs(layer)) -> (x, probs); returns the last x and, if asked, every
    layer's attention probabilities stacked as (L, B, nh, T, T)."""
    attentions = []
    for layer in layers:
        x, probs = layer(x, *inputs(layer))
        if output_attentions:
            attentions.append(probs)
    return x, (torch.stack(attentions) if output_attentions else None)


class PreNormEncoder(nn.Module):
    """A Llama-style encoder (Qwen3, EuroBERT): word embedding, rotary positions 0..T-1 whatever the padding (one
    base, rope_theta), pre-norm layers and a final RMSNorm; no token types, no position embeddings, no embedding
    norm. The same forward as encoder.Encoder: SentenceEncoder, export and verification take either.

    causal: a token sees itself and the real tokens before it (a decoder used as an encoder), else every real token.
    window: a causal token sees only the keys fewer than this many positions behind it, itself included (Mistral's
    sliding window, in every layer); None: every earlier key. inv_freq: the rotary frequencies, where they are not
    the plain ones of rope_theta (Llama 3's scaled ones: rotary.llama3_inv_freq)."""

    def __init__(self, cfg: LlamaStyleSizes, rope_theta: float, layer: Callable[[], PreNormLayer], name: str,
                 causal: bool, window: int | None = None, inv_freq: torch.Tensor | None = None):
        """layer: builds one layer; name: the family's, for messages."""
        super().__init__()
        assert window is None or causal, "a sliding window here is a causal one (Mistral's)"
        self.config = cfg
        self.name, self.causal, self.window = name, causal, window
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        frequencies = default_inv_freq(cfg.head_size, rope_theta) if inv_freq is None else inv_freq
        self.rotary = RotaryEmbedding(frequencies, cfg.max_position_embeddings)
        self.layers = nn.ModuleList(layer() for _ in range(cfg.num_layers))
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, attention_mask: (B, T) int64, mask 1 for real tokens and 0 for padding. Positions are 0..T-1,
        as transformers numbers them: padding goes on the right, or (causal only) on either side. There are no
        token types: token_type_ids is taken (as Encoder's forward takes it) and must be None.

        Returns last_hidden_state (B, T, H) and, if asked, every layer's attention probabilities per query head,
        stacked as (L, B, nh, T, T); causal ones lower-triangular, padded keys exactly 0.
        """
        assert token_type_ids is None, f"{self.name} has no token types (its graphs take no token_type_ids)"
        T = input_ids.shape[1]
        x = self.word(input_ids)  # (B, T, H)
        if self.causal:
            # Padding counts twice: a padded query before every real token (left padding) sees only padded keys
            # and future real keys, and then prefers the future ones, so padded keys get exactly 0 weight from
            # every query. A real query always sees itself, so both kinds of masked keys get exactly 0 there.
            mask = 2 * padding_mask(attention_mask, x.dtype) + causal_mask(T, x.device, x.dtype)  # (B, 1, T, T)
            if self.window is not None:  # a real query's window always holds itself: its masked keys still get 0
                mask = mask + behind_window_mask(T, self.window, x.device, x.dtype)
        else:
            mask = padding_mask(attention_mask, x.dtype)  # (B, 1, 1, T): every query sees every real key
        cos, sin = self.rotary(T)  # (T, hs) each
        x, attentions = run_layers(self.layers, x, output_attentions, lambda _: (mask, cos, sin))
        return self.final_norm(x), attentions

    def attention_reach(self) -> tuple[Reach, ...]:
        """Every layer alike: causal (within the window, where there is one), else every key."""
        return (causal_within(self.window) if self.causal else EVERY_KEY,) * len(self.layers)


# Checkpoint names (transformers' LlamaModel and the classes written after it: EuroBERT, Mistral, Qwen2) -> PreNormLayer
# names, per layer, and the config field that gives each a bias (W_O's is out_bias: Qwen2 biases q, k and v alone).
LLAMA_LAYER_KEYS = {
    "input_layernorm": ("attention_norm", None),
    "self_attn.q_proj": ("attention.query", "attention_bias"),
    "self_attn.k_proj": ("attention.key", "attention_bias"),
    "self_attn.v_proj": ("attention.value", "attention_bias"),
    "self_attn.o_proj": ("attention.out", "out_bias"),
    "post_attention_layernorm": ("feed_forward_norm", None),
    "mlp.gate_proj": ("feed_forward.gate", "mlp_bias"),
    "mlp.up_proj": ("feed_forward.up", "mlp_bias"),
    "mlp.down_proj": ("feed_forward.down", "mlp_bias"),
}


def llama_style_key_map(cfg: ModelConfig) -> dict[str, str]:
    """Checkpoint key (transformers' LlamaModel naming) -> PreNormEncoder key, biases where the config's
    attention_bias, out_bias and mlp_bias say."""
    keys = {"embed_tokens.weight": "word.weight", "norm.weight": "final_norm.weight"}
    for i in range(cfg.num_layers):
        for theirs, (ours, bias_flag) in LLAMA_LAYER_KEYS.items():
            keys[f"layers.{i}.{theirs}.weight"] = f"layers.{i}.{ours}.weight"
            if bias_flag is not None and getattr(cfg, bias_flag):
                keys[f"layers.{i}.{theirs}.bias"] = f"layers.{i}.{ours}.bias"
    return keys
