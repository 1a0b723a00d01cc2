"""The BERT-like families: BERT, RoBERTa, XLM-RoBERTa, DistilBERT and MPNet, which share encoder.py.

They differ only in how their checkpoints are written (config.json's names, the weights' keys) and in a few
settings transformers' classes hard-code, so each is a row of LAYOUTS rather than a file of its own; FAMILIES
makes each row a family.Family like every other family's (model/families.py lists them all).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path

from attnserve.errors import CheckpointError

from . import classifier_heads
from .encoder import ACTIVATIONS, Encoder, EncoderConfig
from .family import Family, WeightNames

# EncoderConfig field -> config.json key, as BERT, RoBERTa, XLM-R and MPNet name them.
BERT_CONFIG_NAMES = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "layer_norm_eps": "layer_norm_eps", "pad_token_id": "pad_token_id", "hidden_act": "hidden_act",
    "relative_attention_buckets": "relative_attention_num_buckets",
}
# EncoderConfig fields that config.json must give; the others default as the family's transformers config does.
REQUIRED = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings")
# Checkpoint key (in the family's naming, after the task prefix) -> Encoder key, per layer with {i}.
BERT_EMBEDDINGS = {
    "embeddings.word_embeddings.weight": "embeddings.word.weight",
    "embeddings.position_embeddings.weight": "embeddings.position.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
}
BERT_LAYER = {
    "attention.self.query": "attention.query",
    "attention.self.key": "attention.key",
    "attention.self.value": "attention.value",
    "attention.output.dense": "attention.out",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "feed_forward.up",
    "output.dense": "feed_forward.down",
    "output.LayerNorm": "output_norm",
}
# Keys some checkpoints carry that the encoder does not use: BERT's NSP pooler
# (sentence embeddings pool the hidden states instead) and a position-id buffer.
IGNORED_KEYS = ("pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids")


@dataclass(frozen=True)
class Layout:
    """How one BERT-like model_type's checkpoints are written, and where it differs from BERT."""

    # Architectures whose output is the encoder's own: the bare encoder, and a masked-LM model used as an
    # encoder. Any other (ForSequenceClassification, ForQuestionAnswering, ForPreTraining, ...) ends in a
    # head whose output the export would silently drop.
    architectures: tuple[str, ...]
    task_prefix: str  # where a task model (XForMaskedLM) puts the encoder's keys
    encoder_parts: tuple[str, ...]  # the prefixes of the encoder's own keys
    # The masked-LM head of an XForMaskedLM checkpoint: used as an encoder, the head goes unused,
    # exactly as transformers' AutoModel (what sentence-transformers loads) leaves it.
    unused_heads: tuple[str, ...]
    layers: str  # the prefix of layer i's keys, with {i}
    layer_keys: dict[str, str]  # per-layer module names -> the Encoder's (weight and bias each)
    embedding_keys: dict[str, str] = field(default_factory=lambda: BERT_EMBEDDINGS)
    extra_keys: dict[str, str] = field(default_factory=dict)  # other whole keys -> the Encoder's
    config_names: dict[str, str] = field(default_factory=lambda: BERT_CONFIG_NAMES)
    # transformers' defaults for the config fields a config.json may leave out.
    defaults: dict = field(default_factory=dict)
    # Fields set by the family whatever config.json says: where transformers' class hard-codes them.
    fixed: dict = field(default_factory=dict)


BERT_DEFAULTS = {"type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0, "hidden_act": "gelu"}
ROBERTA_DEFAULTS = {**BERT_DEFAULTS, "pad_token_id": 1}
LAYOUTS = {
    "bert": Layout(("BertModel", "BertForMaskedLM"), "bert.", ("embeddings.", "encoder.", "pooler."),
                   ("cls.predictions.",), "encoder.layer.{i}.", BERT_LAYER, defaults=BERT_DEFAULTS,
                   fixed={"relative_attention_buckets": 0}),
    # RoBERTa and XLM-R: BERT's keys and layout; positions after padding (their config has one token type).
    "roberta": Layout(("RobertaModel", "RobertaForMaskedLM"), "roberta.", ("embeddings.", "encoder.", "pooler."),
                      ("lm_head.",), "encoder.layer.{i}.", BERT_LAYER, defaults=ROBERTA_DEFAULTS,
                      fixed={"positions_after_padding": True, "relative_attention_buckets": 0}),
    "xlm-roberta": Layout(("XLMRobertaModel", "XLMRobertaForMaskedLM"), "roberta.",
                          ("embeddings.", "encoder.", "pooler."), ("lm_head.",), "encoder.layer.{i}.", BERT_LAYER,
                          defaults=ROBERTA_DEFAULTS,
                          fixed={"positions_after_padding": True, "relative_attention_buckets": 0}),
    # DistilBERT: its own config and key names, no token types, and eps 1e-12 hard-coded in transformers.
    "distilbert": Layout(
        ("DistilBertModel", "DistilBertForMaskedLM"), "distilbert.", ("embeddings.", "transformer."),
        ("vocab_transform.", "vocab_layer_norm.", "vocab_projector."), "transformer.layer.{i}.",
        {"attention.q_lin": "attention.query", "attention.k_lin": "attention.key", "attention.v_lin": "attention.value",
         "attention.out_lin": "attention.out", "sa_layer_norm": "attention_norm", "ffn.lin1": "feed_forward.up",
         "ffn.lin2": "feed_forward.down", "output_layer_norm": "output_norm"},
        embedding_keys={k: v for k, v in BERT_EMBEDDINGS.items() if "token_type" not in k},
        config_names={"vocab_size": "vocab_size", "hidden_size": "dim", "num_layers": "n_layers",
                      "num_heads": "n_heads", "intermediate_size": "hidden_dim",
                      "max_position_embeddings": "max_position_embeddings", "pad_token_id": "pad_token_id",
                      "hidden_act": "activation"},
        defaults={"pad_token_id": 0, "hidden_act": "gelu"},
        fixed={"type_vocab_size": 0, "layer_norm_eps": 1e-12, "relative_attention_buckets": 0}),
    # MPNet: no token types, positions after padding with padding index 1 (hard-coded in transformers'
    # MPNetEmbeddings, whatever pad_token_id says), and one relative position bias table for all layers.
    "mpnet": Layout(
        ("MPNetModel", "MPNetForMaskedLM"), "mpnet.", ("embeddings.", "encoder.", "pooler."), ("lm_head.",),
        "encoder.layer.{i}.",
        {"attention.attn.q": "attention.query", "attention.attn.k": "attention.key",
         "attention.attn.v": "attention.value", "attention.attn.o": "attention.out",
         "attention.LayerNorm": "attention_norm", "intermediate.dense": "feed_forward.up",
         "output.dense": "feed_forward.down", "output.LayerNorm": "output_norm"},
        embedding_keys={k: v for k, v in BERT_EMBEDDINGS.items() if "token_type" not in k},
        extra_keys={"encoder.relative_attention_bias.weight": "relative_attention_bias.weight"},
        defaults={"layer_norm_eps": 1e-12, "hidden_act": "gelu", "relative_attention_buckets": 32},
        fixed={"type_vocab_size": 0, "pad_token_id": 1, "positions_after_padding": True}),
}
# transformers' MPNetEncoder buckets relative positions into 32 whatever the config's table size.
MPNET_BUCKETS = 32


def read_config(family: str, raw: dict, path: Path) -> EncoderConfig:
    """config.json of a `family` (a key of LAYOUTS) checkpoint -> its EncoderConfig, or a one-line refusal."""
    spec = LAYOUTS[family]
    act = raw.get(spec.config_names["hidden_act"], spec.defaults["hidden_act"])
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{path}: {spec.config_names['hidden_act']} {act!r} is not supported "
                              f"(only {', '.join(sorted(ACTIVATIONS))})")
    if raw.get("position_embedding_type") not in (None, "absolute"):
        raise CheckpointError(f"{path}: only absolute position embeddings are supported")
    architectures = raw.get("architectures") or []
    if not isinstance(architectures, list):
        raise CheckpointError(f"{path}: architectures must be a list, got {architectures!r}")
    # A reranker's head (classifier_heads.HEADS) was taken off architectures by read_checkpoint.
    head_archs = [a for a in architectures if a not in spec.architectures]
    rerankers = classifier_heads.architectures_on(family)
    if head_archs:
        raise CheckpointError(f"{path}: cannot reproduce architecture {head_archs[0]} (the export runs the bare "
                              f"encoder: {' or '.join(spec.architectures)}"
                              + (f", or a reranker: {' or '.join(rerankers)})" if rerankers else ")"))
    if raw.get("is_decoder"):
        raise CheckpointError(f"{path}: cannot reproduce is_decoder true (causal attention)")
    if family == "mpnet" and raw.get("relative_attention_num_buckets", MPNET_BUCKETS) != MPNET_BUCKETS:
        raise CheckpointError(f"{path}: cannot reproduce relative_attention_num_buckets "
                              f"{raw['relative_attention_num_buckets']!r} (transformers buckets into {MPNET_BUCKETS})")
    kinds = {f.name: f.type for f in fields(EncoderConfig)}
    convert = {"int": int, "float": float, "str": str, "bool": bool}
    values: dict = {"family": family, **spec.fixed}
    try:
        for ours, theirs in spec.config_names.items():
            if ours in values:
                continue
            value = raw[theirs] if ours in REQUIRED else raw.get(theirs, spec.defaults.get(ours))
            if value is not None:
                values[ours] = convert[str(kinds[ours])](value)
        cfg = EncoderConfig(**values)
    except KeyError as e:
        raise CheckpointError(f"{path}: missing field {e.args[0]!r}") from None
    except (TypeError, ValueError, AssertionError, ZeroDivisionError) as e:
        raise CheckpointError(f"{path}: invalid config: {e}") from None
    sizes = {k: getattr(cfg, k) for k in REQUIRED}
    if any(v < 1 for v in sizes.values()) or not cfg.layer_norm_eps > 0 or cfg.usable_positions < 1:
        raise CheckpointError(f"{path}: invalid config: sizes must be positive and layer_norm_eps above 0, got {sizes}"
                              f" and {cfg.layer_norm_eps}")
    if cfg.type_vocab_size < 0 or (cfg.positions_after_padding and cfg.pad_token_id < 0):
        raise CheckpointError(f"{path}: invalid config: type_vocab_size {cfg.type_vocab_size} and pad_token_id "
                              f"{cfg.pad_token_id} must not be negative")
    return cfg


def key_map(cfg: EncoderConfig) -> dict[str, str]:
    """Checkpoint key (the family's transformers naming) -> Encoder key. The only place the namings meet."""
    spec = LAYOUTS[cfg.family]
    keys = {k: v for k, v in spec.embedding_keys.items() if cfg.type_vocab_size or "token_type" not in k}
    keys.update(spec.extra_keys)
    for i in range(cfg.num_layers):
        for theirs, ours in spec.layer_keys.items():
            for param in ("weight", "bias"):
                keys[f"{spec.layers.format(i=i)}{theirs}.{param}"] = f"layers.{i}.{ours}.{param}"
    return keys


def _family(model_type: str) -> Family:
    layout = LAYOUTS[model_type]
    return Family(model_type, partial(read_config, model_type), key_map, Encoder,
                  WeightNames(layout.task_prefix, layout.encoder_parts, layout.unused_heads, IGNORED_KEYS))


FAMILIES = tuple(_family(model_type) for model_type in LAYOUTS)
