"""jina-embeddings-v3 (transformers' JinaEmbeddingsV3Model), its config, key map and per-task LoRA adapters.

It is XLM-RoBERTa's post-LN encoder with these differences, and only these:
- positions are rotary (RoPE, transformers' "default" rope, base rope_parameters.rope_theta, 20000 by default),
  applied to queries and keys in every layer; there are no position embeddings (the token type embedding, one
  type, is still added);
- the feed-forward is fc1 -> activation -> fc2 (CLIP's MLP), the attention q/k/v/o projections with biases
  (so the encoder is rotary_bert.py's with its plain feed-forward);
- the five task adapters (retrieval.query, retrieval.passage, separation, classification, text-matching) are LoRA
  on the encoder's Linear layers and the word embeddings. transformers' JinaEmbeddingsV3Model carries none itself:
  each task is a PEFT LoRA adapter folder, `adapters/<task>/` (adapter_config.json + adapter_model.safetensors),
  as transformers' load_adapter(path, adapter_name=task) + set_adapter(task) apply them. config.json's
  `lora_adaptations` (jina's own field) names the tasks in order.
A task is served merged into the weights (W + lora_alpha / r * B A, as PEFT's merge does), one graph set per task
(export/artifacts.py, docs/families/jina_embeddings_v3.md say why); the graphs without a task have no adapter, as
sentence-transformers gives when no task is set.

Shapes: B batch, T sequence, H hidden, nh heads, hs head size (H // nh), F intermediate size, L layers,
r the LoRA rank, V the vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn as nn

from attnserve.errors import CheckpointError

from .config_reading import (
    check_architectures,
    check_positive,
    check_supported,
    invalid_config,
    plain_rope_theta,
    refuse_rope_scaling,
)
from .encoder import ACTIVATIONS
from .family import EncoderSizes, Family, WeightNames
from .rotary import RotaryPositions, default_inv_freq
from .rotary_bert import PlainFeedForward, RotaryBertEncoder

MODEL_TYPE = "jina_embeddings_v3"
TASKS = ("retrieval.query", "retrieval.passage", "separation", "classification", "text-matching")
ADAPTERS = "adapters"  # the folder of the per-task PEFT adapters, beside config.json
DEFAULT_ROPE_THETA = 20000.0  # JinaEmbeddingsV3Config.default_theta


@dataclass(frozen=True)
class JinaV3Config(EncoderSizes, RotaryPositions):
    rope_theta: float = DEFAULT_ROPE_THETA
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    hidden_act: str = "gelu"
    type_vocab_size: int = 1
    tasks: tuple[str, ...] = ()  # the adapters the checkpoint carries, in lora_adaptations' order
    directory: Path | None = None  # where adapters/<task>/ are read from
    task: str | None = None  # the adapter merged into the weights on load; None: none
    family: ClassVar[str] = MODEL_TYPE
    # Biases on the fused query/key/value projection (mixer.Wqkv) and the output one (mixer.out_proj).
    qkv_bias: ClassVar[bool] = True
    out_bias: ClassVar[bool] = True
    # One token type: its embedding is added to every token, and the graphs take no token_type_ids.
    has_token_types: ClassVar[bool] = False

    def __post_init__(self) -> None:
        assert self.hidden_size % self.num_heads == 0, "hidden_size must divide evenly into heads"
        assert (self.hidden_size // self.num_heads) % 2 == 0, "rotary embeddings need an even head size"
        assert self.task is None or self.task in self.tasks, "the merged task must be one of the adapters"

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads


class JinaV3Encoder(RotaryBertEncoder):
    """rotary_bert's post-LN encoder with BERT's plain feed-forward (fc1 -> activation -> fc2) and one token type."""

    def __init__(self, cfg: JinaV3Config):
        super().__init__(cfg, lambda c, _: PlainFeedForward(c.hidden_size, c.intermediate_size, c.hidden_act),
                         default_inv_freq(cfg.head_size, cfg.rope_theta))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As RotaryBertEncoder's; one token type: token_type_ids must be None (type 0 for every token, as
        transformers' default)."""
        assert token_type_ids is None, "jina-embeddings-v3 has one token type (its graphs take no token_type_ids)"
        return super().forward(input_ids, attention_mask, output_attentions)


# The bare model and the masked-LM model used as an encoder; any other architecture ends in a head.
ENCODER_ARCHITECTURES = ("JinaEmbeddingsV3Model", "JinaEmbeddingsV3ForMaskedLM")
TASK_PREFIX = "roberta."  # where JinaEmbeddingsV3ForMaskedLM keeps the encoder
ENCODER_PARTS = ("embeddings.", "emb_ln.", "encoder.", "pooler.")
UNUSED_HEADS = ("lm_head.",)
# Checkpoint module (per layer with {i}) -> JinaV3Encoder module; each has a weight and a bias. transformers saves
# JinaEmbeddingsV3Model in the naming of jina's own checkpoints (its conversion_mapping, reversed on save).
LAYER_MODULES = {
    "mixer.Wqkv": "attention.qkv", "mixer.out_proj": "attention.out", "norm1": "attention_norm",
    "mlp.fc1": "feed_forward.up", "mlp.fc2": "feed_forward.down", "norm2": "output_norm",
}
# A PEFT adapter names modules as transformers does after loading: PEFT module -> (our weight, its rows: which
# third of the fused qkv projection, or None for all of it).
ADAPTER_MODULES = {
    "self_attn.q_proj": ("attention.qkv", 0), "self_attn.k_proj": ("attention.qkv", 1),
    "self_attn.v_proj": ("attention.qkv", 2), "self_attn.o_proj": ("attention.out", None),
    "mlp.fc1": ("feed_forward.up", None), "mlp.fc2": ("feed_forward.down", None),
}
# The modules a LoRA adapter may target (PEFT's target_modules names them by their last part).
LORA_TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2", "word_embeddings"}
# adapter_config.json settings and the only values reproduced here (PEFT's plain LoRA, merged).
LORA_FIXED = {"peft_type": "LORA", "bias": "none", "use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
              "lora_bias": False, "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
              "layers_to_transform": None, "layers_pattern": None, "trainable_token_indices": None,
              "target_parameters": None, "megatron_config": None, "alora_invocation_tokens": None,
              "use_qalora": False, "layer_replication": None}


def read_config(raw: dict[str, Any], path: Path) -> JinaV3Config:
    """config.json of a JinaEmbeddingsV3 checkpoint and its adapters' adapter_config.json, as transformers and PEFT
    read them, or a one-line refusal of what the export does not run."""
    check_architectures(raw, path, ENCODER_ARCHITECTURES)
    check_supported(path, "hidden_act", raw.get("hidden_act", "gelu"), sorted(ACTIVATIONS))
    if raw.get("type_vocab_size", 1) != 1:
        raise CheckpointError(f"{path}: cannot reproduce type_vocab_size {raw['type_vocab_size']!r} (only 1)")
    with invalid_config(path):
        cfg = JinaV3Config(
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            num_layers=int(raw["num_hidden_layers"]), num_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 8194)),
            rope_theta=_rope_theta(raw, path), layer_norm_eps=float(raw.get("layer_norm_eps", 1e-5)),
            pad_token_id=int(raw["pad_token_id"] if raw.get("pad_token_id") is not None else 1),
            hidden_act=str(raw.get("hidden_act", "gelu")), tasks=_tasks(raw, path), directory=path.parent,
        )
    check_positive(cfg, path, ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                               "max_position_embeddings"),
                   "layer_norm_eps and rope_theta", cfg.layer_norm_eps, cfg.rope_theta)
    for task in cfg.tasks:
        _adapter_settings(cfg, task)  # every adapter's settings are checked before any weight loads
    return cfg


def _rope_theta(raw: dict[str, Any], path: Path) -> float:
    refuse_rope_scaling(raw, path)
    return plain_rope_theta(raw.get("rope_parameters") or {}, raw.get("rotary_emb_base", DEFAULT_ROPE_THETA), path)


def _tasks(raw: dict[str, Any], path: Path) -> tuple[str, ...]:
    """config.json's lora_adaptations, each with its adapter folder; an adapter folder it does not name is refused
    (it would be silently left out)."""
    tasks = raw.get("lora_adaptations") or []
    if not isinstance(tasks, list) or not all(isinstance(t, str) and t for t in tasks) or len(set(tasks)) != len(
            tasks):
        raise CheckpointError(f"{path}: lora_adaptations must list distinct task names, got {tasks!r}")
    folder = path.parent / ADAPTERS
    present = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    unnamed = [p for p in present if p not in tasks]
    if unnamed:
        raise CheckpointError(f"{folder}: adapter {unnamed[0]!r} is not in config.json's lora_adaptations {tasks}")
    missing = [t for t in tasks if t not in present]
    if missing:
        raise CheckpointError(f"{path}: lora_adaptations names {missing[0]!r}, but {folder / missing[0]} "
                              "(a PEFT LoRA adapter: adapter_config.json + adapter_model.safetensors) is missing")
    return tuple(tasks)


@dataclass(frozen=True)
class AdapterSettings:
    rank: int
    alpha: float
    targets: frozenset[str]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank  # PEFT's scaling without rslora


def _adapter_settings(cfg: JinaV3Config, task: str) -> AdapterSettings:
    assert cfg.directory is not None
    folder = cfg.directory / ADAPTERS / task
    path = folder / "adapter_config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable: {e}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    if not (folder / "adapter_model.safetensors").is_file():
        raise CheckpointError(f"adapter file missing: {folder / 'adapter_model.safetensors'} (only safetensors)")
    for key, value in LORA_FIXED.items():
        if raw.get(key, value) not in (value, None, {}, []) or (key == "peft_type" and raw.get(key) != value):
            raise CheckpointError(f"{path}: cannot reproduce {key} {raw.get(key)!r} (only {value!r}: plain LoRA)")
    targets = raw.get("target_modules")
    if isinstance(targets, str) or not isinstance(targets, list) or not set(targets) <= LORA_TARGETS:
        raise CheckpointError(f"{path}: cannot reproduce target_modules {targets!r} "
                              f"(a list of {', '.join(sorted(LORA_TARGETS))})")
    try:
        settings = AdapterSettings(int(raw["r"]), float(raw["lora_alpha"]), frozenset(targets))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: r and lora_alpha must be numbers: {e}") from None
    if settings.rank < 1:
        raise CheckpointError(f"{path}: r must be positive, got {settings.rank}")
    return settings


def key_map(cfg: JinaV3Config) -> dict[str, str]:
    """Checkpoint key (as transformers saves JinaEmbeddingsV3Model) -> JinaV3Encoder key."""
    keys = {"embeddings.word_embeddings.weight": "word.weight",
            "embeddings.token_type_embeddings.weight": "token_type.weight",
            "emb_ln.weight": "embeddings_norm.weight", "emb_ln.bias": "embeddings_norm.bias"}
    for i in range(cfg.num_layers):
        for theirs, ours in LAYER_MODULES.items():
            for param in ("weight", "bias"):
                keys[f"encoder.layers.{i}.{theirs}.{param}"] = f"layers.{i}.{ours}.{param}"
    return keys


def build(cfg: JinaV3Config) -> JinaV3Encoder:
    return JinaV3Encoder(cfg)


def merge_task(cfg: JinaV3Config, encoder: nn.Module) -> None:
    """Merge cfg.task's adapter into the loaded weights: W += lora_alpha / r * B A, as PEFT's merge_adapter does
    (for the word embeddings, (B A)^T: PEFT keeps an embedding's A as (r, V) and B as (H, r))."""
    if cfg.task is None:
        return
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    assert cfg.directory is not None
    settings = _adapter_settings(cfg, cfg.task)
    weights = cfg.directory / ADAPTERS / cfg.task / "adapter_model.safetensors"
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"corrupt adapter weights {weights}: {e}") from None
    # PEFT key prefix -> (our weight, which third of its rows or None, whether it is an embedding).
    targets: dict[str, tuple[str, int | None, bool]] = {
        "base_model.model.embeddings.word_embeddings.": ("word.weight", None, True)}
    for i in range(cfg.num_layers):
        for theirs, (ours, third) in ADAPTER_MODULES.items():
            targets[f"base_model.model.layers.{i}.{theirs}."] = (f"layers.{i}.{ours}.weight", third, False)
    own = dict(encoder.named_parameters())
    used: set[str] = set()
    with torch.no_grad():
        for prefix, (ours, third, embedding) in targets.items():
            a_key, b_key = ((prefix + "lora_embedding_A", prefix + "lora_embedding_B") if embedding
                            else (prefix + "lora_A.weight", prefix + "lora_B.weight"))
            if a_key not in tensors and b_key not in tensors:
                continue  # a module the adapter does not target
            if a_key not in tensors or b_key not in tensors:
                raise CheckpointError(f"{weights}: {a_key if a_key not in tensors else b_key} is missing")
            A, B = tensors[a_key].float(), tensors[b_key].float()  # (r, in), (out, r); an embedding's: (r, V), (H, r)
            delta = settings.scale * (B @ A)  # (out, in); an embedding's (H, V)
            weight: torch.Tensor = own[ours]
            part: torch.Tensor
            if embedding:
                delta, part = delta.T, weight  # the table is (V, H)
            else:
                rows = weight.shape[0] // 3
                part = weight if third is None else weight[third * rows:(third + 1) * rows]  # a view: (out, in)
            if A.shape[0] != settings.rank or delta.shape != part.shape:
                raise CheckpointError(f"{weights}: {a_key} {tuple(A.shape)} and {b_key} {tuple(B.shape)} do not make "
                                      f"a rank-{settings.rank} update of {tuple(part.shape)}")
            part.add_(delta)
            used |= {a_key, b_key}
    unexpected = sorted(set(tensors) - used)
    if unexpected:
        raise CheckpointError(f"{weights}: cannot reproduce adapter keys {unexpected[:3]} "
                              f"({len(unexpected)} tensors the merge does not use)")


def with_task(cfg: JinaV3Config, task: str | None) -> JinaV3Config:
    """The config whose encoder has `task`'s adapter merged on load (None: none)."""
    return replace(cfg, task=task)


FAMILY = Family(
    model_type=MODEL_TYPE, read_config=read_config, key_map=key_map, build=build,
    weights=WeightNames(TASK_PREFIX, ENCODER_PARTS, UNUSED_HEADS, ("pooler.dense.weight", "pooler.dense.bias")),
    after_load=merge_task,
)
