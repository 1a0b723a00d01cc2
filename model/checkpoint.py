"""Encoder checkpoints (config.json + model.safetensors + tokenizer.json) -> the family's encoder.

The family comes from config.json's model_type, through the one registry (families.py): each family reads its
own config.json, maps its weights' keys and builds its encoder (family.py; the BERT-likes share encoder.py and
are rows of bert_likes.py).
A checkpoint with a classification head of classifier_heads.HEADS is a reranker (cross_encoder.py).

Only safetensors is read: a pickle checkpoint can run code on load. Weights are
copied through an explicit key map, and any key that is missing, unexpected
or of the wrong shape fails the load with the key's name.

A checkpoint is exported only if its whole pipeline is one the export reproduces:
a bare encoder of a known family (config.json's architectures and the weights' heads say so)
and the sentence-transformers pipeline that pipeline.py reads. Everything else
is refused here, from metadata and the weights' header, before any weight is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from attnserve.errors import CheckpointError

from . import classifier_heads, clip, cross_encoder, llm_reranker, pylate_colbert, splade, static_embedding
from .checkpoint_files import legacy_renamed, read_json
from .families import FAMILIES, family_of
from .family import EncoderModule, ModelConfig, WeightNames
from .llm_reranker import Kind as LLMRerankerKind
from .llm_reranker import PairTemplate, QueryDocumentTemplate
from .pipeline import Pipeline, read_pipeline, tokenizer_max_length
from .sentence_head import load_token_vectors
from .tokenizer_files import tokenizer_json
from .uninitialised import uninitialised_weights
from .weights_files import Weights, has_weights


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    name: str
    config: ModelConfig  # the family's own (families.py): encoder.EncoderConfig for the BERT-likes
    pipeline: Pipeline  # the sentence-transformers modules after the encoder, the prompts, max_seq_length

    @property
    def pooling(self) -> str:
        """The manifest's name of the pooling: "mean", "cls", or several modes joined by "+"."""
        return self.pipeline.pooling_name

    @property
    def normalize(self) -> bool:
        """Whether the checkpoint's pipeline ends in L2 normalisation."""
        return self.pipeline.normalize

    @property
    def max_seq_length(self) -> int:
        """Inputs are truncated to this many tokens, specials included."""
        return self.pipeline.max_seq_length

    @property
    def max_seq_length_from(self) -> str:
        """Where max_seq_length came from: "sentence_bert_config.json", or "tokenizer" (its model_max_length,
        capped at the model's positions), which the export checks against transformers' own tokenizer."""
        return self.pipeline.max_seq_length_from

    @property
    def embedding_size(self) -> int:
        """The size of the sentence embedding: the hidden size, times the pooling modes, or a Dense's output."""
        return self.pipeline.embedding_size(self.config.hidden_size)

    @property
    def modules(self) -> list[str]:
        """The whole pipeline in short words, for the manifest and the export's log."""
        family = self.config.family
        if isinstance(self.config, static_embedding.StaticConfig):
            return [f"StaticEmbedding({self.config.library})", "Pooling(mean)",
                    *(["Normalize"] if self.normalize else [])]
        if self.llm_reranker is not None:
            yes, no = self.llm_reranker.answers
            return [f"Transformer({family})",
                    f"LogitScore({yes}{'' if no is None else f' - {no}'} at the last token, {self.score_activation})"]
        if self.head is not None:
            return [f"Transformer({family})",
                    f"Classifier({self.head.architecture}, {self.num_labels}, {self.score_activation})"]
        return self.pipeline.modules(family)
    kind: str = "embedder"  # or "reranker": a checkpoint with a classification head (cross_encoder.py)
    num_labels: int = 0  # a reranker's classifier outputs
    score_activation: str | None = None  # a reranker's CrossEncoder activation (cross_encoder.ACTIVATIONS)
    # An LLM reranker (llm_reranker.py): which one, and the one templated text it scores per pair rather than the
    # tokenizer's pair.
    llm_reranker: LLMRerankerKind | None = None
    pair_template: PairTemplate | QueryDocumentTemplate | None = None
    head: classifier_heads.Head | None = None  # a reranker's classification head
    # A classifier's label names in output order (config.json's id2label), and its problem_type
    # ("single_label_classification", "multi_label_classification" or None), which decide how /predict scores.
    labels: tuple[str, ...] = ()
    problem_type: str | None = None

    @property
    def weights(self) -> Weights:
        """The weights' files (model.safetensors, or its shards), their headers read; tensors read as asked."""
        return Weights(self.directory)

    @property
    def tokenizer_file(self) -> Path:
        """tokenizer.json: the checkpoint's, or the one built from its slow tokenizer's files (tokenizer_files.py)."""
        return tokenizer_json(self.directory)


def _encoder_prefix(keys: list[str], names: WeightNames) -> str:
    return names.task_prefix if any(k.startswith(names.task_prefix) for k in keys) else ""


def _owned_by_encoder(key: str, prefix: str, names: WeightNames) -> bool:
    return key.startswith(prefix) and key.removeprefix(prefix).startswith(names.encoder_parts)


def _head_keys(keys: list[str], names: WeightNames) -> list[str]:
    """Keys outside the encoder that are not an unused masked-LM head: the weights of a task head."""
    prefix = _encoder_prefix(keys, names)
    return [k for k in keys if not k.startswith(names.unused_heads) and not _owned_by_encoder(k, prefix, names)]


def _projection_keys(pipeline: Pipeline) -> set[str]:
    """The checkpoint's own keys that a ColBERT's Dense reads (a Stanford-NLP folder's linear.weight)."""
    return {k for d in pipeline.multi_vector.dense for k in d.checkpoint_keys} if pipeline.multi_vector else set()


def _check_no_head(weights: Weights, names: WeightNames, projection: set[str] | None = None) -> None:
    """Refuse, from the headers alone, a checkpoint that carries a task head (projection: keys the pipeline
    reads itself)."""
    head_keys = [k for k in _head_keys(weights.keys(), names) if k not in (projection or set())]
    if head_keys:
        modules = sorted({k.rsplit(".", 1)[0] for k in head_keys})
        raise CheckpointError(f"{weights.name}: cannot reproduce the head "
                              f"{', '.join(m + '.*' for m in modules[:3])}{'...' if len(modules) > 3 else ''} "
                              f"({len(head_keys)} tensors outside the encoder)")


def _check_classifier_head(weights: Weights, names: WeightNames, head: classifier_heads.Head) -> None:
    """Refuse, from the headers alone, a reranker whose keys outside the encoder are not exactly its head's."""
    keys = weights.keys()
    expected = set(head.keys)
    missing = sorted(expected - set(keys))
    if missing:
        raise CheckpointError(f"{weights.name}: the {head.architecture} head lacks {', '.join(missing)}")
    prefix = _encoder_prefix(keys, names)
    others = sorted(k for k in keys if k not in expected and not _owned_by_encoder(k, prefix, names))
    if others:
        raise CheckpointError(f"{weights.name}: a {head.architecture} checkpoint must hold exactly the classifier "
                              f"head ({', '.join(sorted(expected))}) outside the encoder, but also has "
                              f"{', '.join(others[:5])}{'...' if len(others) > 5 else ''}")


def read_checkpoint(directory: str | Path, name: str | None = None) -> Checkpoint:
    """Read a checkpoint's metadata, check that every file serving needs is there, and refuse what
    the export cannot reproduce; no weights are loaded."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    # A legacy sentence-transformers save of CLIP keeps the checkpoint in its model module's folder (0_CLIPModel).
    name, directory = name or directory.name, clip.module_folder(directory) or directory
    if static_embedding.is_static(directory):  # a token table and a mean: no config.json model_type to read
        config, pipeline = static_embedding.read_static(directory)
        return Checkpoint(directory, name, config, pipeline)
    raw = read_json(directory / "config.json")
    # A cross-encoder's head is read by the head table; the family then reads the encoder as a bare one.
    head = classifier_heads.head_of(raw, directory / "config.json") if isinstance(raw, dict) else None
    # A Stanford-NLP ColBERT (HF_ColBERT) is the encoder and its linear.weight (model/pylate_colbert.py).
    stanford = pylate_colbert.is_stanford(directory)
    encoder_raw = {**raw, "architectures": []} if head or stanford else raw
    # Each family reads its own config; a ModernBERT config is no BERT config with extra fields.
    family = family_of(raw, directory / "config.json")
    cfg = family.read_config(encoder_raw, directory / "config.json")
    if not has_weights(directory) and any(directory.glob("*.bin")):
        raise CheckpointError(f"{directory}: only model.safetensors is accepted, not pickle .bin weights")
    weights = Weights(directory)  # the headers, checked; no tensor is read
    tokenizer_json(directory)  # its own, or built from a slow tokenizer's files: checked before anything else
    if head is not None:
        return _read_reranker(directory, name, cfg, raw, head, weights)
    llm = llm_reranker.recognise(raw, directory)
    if llm is not None:
        return _read_llm_reranker(directory, name, cfg, raw, weights, llm)
    pipeline = (family.pipeline(directory, cfg) if family.pipeline is not None else
                read_pipeline(directory, cfg.usable_positions, cfg.hidden_size))
    _check_no_head(weights, FAMILIES[cfg.family].weights, _projection_keys(pipeline))
    if pipeline.splade is not None:  # SPLADE over the MLM head (model/splade.py): BERT's only
        if cfg.family != "bert":
            raise CheckpointError(f"{directory}: cannot reproduce a SparseEncoder over {cfg.family}'s masked-LM "
                                  "head (only BERT's, BertForMaskedLM)")
        splade.check_head_keys({legacy_renamed(k) for k in weights.keys()}, directory / "model.safetensors")
    return Checkpoint(directory, name or directory.name, cfg, pipeline)


def _read_reranker(directory: Path, name: str | None, cfg: ModelConfig, raw: dict,
                   head: classifier_heads.Head, weights: Weights) -> Checkpoint:
    """A cross-encoder: the encoder, its classification head (classifier_heads.py), the CrossEncoder's settings
    (cross_encoder.py)."""
    spec = cross_encoder.read_reranker(directory, raw)
    _check_classifier_head(weights, FAMILIES[cfg.family].weights, head)
    length, length_from = spec.max_seq_length, "sentence_bert_config.json"
    if length is None:
        length, length_from = tokenizer_max_length(directory, cfg.usable_positions), "tokenizer"
    if length > cfg.usable_positions:
        raise CheckpointError(f"{directory}: cannot reproduce max_seq_length {length}: the model has only "
                              f"{cfg.usable_positions} positions")
    # No sentence-transformers pipeline follows the classifier: the manifest's pooling says "cls" (the head's,
    # but for ModernBERT's classifier_pooling "mean").
    pooling = "mean" if getattr(head.options, "pooling", "cls") == "mean" else "cls"
    pipeline = Pipeline((pooling,), (), False, length, length_from, {}, None)
    return Checkpoint(directory, name or directory.name, cfg, pipeline, kind="reranker", num_labels=spec.num_labels,
                      score_activation=spec.score_activation, head=head,
                      labels=cross_encoder.label_names(raw, spec.num_labels, directory / "config.json"),
                      problem_type=cross_encoder.problem_type(raw, directory / "config.json"))


def _read_llm_reranker(directory: Path, name: str | None, cfg: ModelConfig, raw: dict, weights: Weights,
                       kind: llm_reranker.Kind) -> Checkpoint:
    """An LLM reranker: the causal LM's answer logits after its reference's template (llm_reranker.py)."""
    _check_no_head(weights, FAMILIES[cfg.family].weights)  # lm_head is its only key outside
    tokenizer = tokenizer_json(directory)
    llm_reranker.answer_ids(kind, tokenizer)
    llm_reranker.tied_embeddings(raw, directory / "config.json", kind)
    template = llm_reranker.pair_template(kind, tokenizer, directory, cfg.usable_positions)
    # The longest templated pair (the template's own cuts), or the tokenizer's length (Qwen3-Reranker's body cut).
    length, length_from = (template.longest, "template") if isinstance(template, llm_reranker.QueryDocumentTemplate) \
        else (tokenizer_max_length(directory, cfg.usable_positions), "tokenizer")
    pipeline = Pipeline(("lasttoken",), (), False, length, length_from, {}, None)
    return Checkpoint(directory, name or directory.name, cfg, pipeline, kind="reranker", num_labels=1,
                      score_activation=kind.activation, llm_reranker=kind, pair_template=template)


def load_encoder(ckpt: Checkpoint, dtype: torch.dtype | None = None) -> EncoderModule:
    """Build the Encoder and copy the checkpoint's weights into it, under loud checks.

    The weights are held once: the encoder's parameters are allocated but never initialised (their pages are not
    touched until a weight lands there), and each tensor is read from its file, converted to `dtype` (default
    float32) and made the parameter, one at a time. A checkpoint's weights loaded whole beside a freshly
    initialised encoder held them 2.6x (all-mpnet-base-v2: 1.07 GB at its peak for 0.44 GB of weights).
    A half-precision dtype (export straight into fp16) keeps the encoder's buffers in float32 (rotary and bucket
    tables): tracing converts them (export/torch_to_onnx.py)."""
    dtype = dtype or torch.float32
    if isinstance(ckpt.config, static_embedding.StaticConfig):
        return cast(EncoderModule, static_embedding.load_static(ckpt.directory, ckpt.config, dtype))
    weights = ckpt.weights
    # A masked-LM checkpoint prefixes the encoder's keys ("bert.", "roberta.", ...) and adds its (unused) head;
    # read_checkpoint has refused any other head, so every other key must be the encoder's.
    family = FAMILIES[ckpt.config.family]
    names = family.weights
    prefix = _encoder_prefix(weights.keys(), names)
    # A reranker's head (loaded by cross_encoder.py), a Stanford-NLP ColBERT's projection (by sentence_head.py).
    head_keys = (set(ckpt.head.keys) if ckpt.head else set()) | _projection_keys(ckpt.pipeline)
    stored = {legacy_renamed(k.removeprefix(prefix)): k for k in weights.keys()
              if not k.startswith(names.unused_heads) and k not in head_keys}
    cfg = ckpt.config
    mapping = family.key_map(cfg)
    missing = sorted(set(mapping) - set(stored))
    unexpected = sorted(set(stored) - set(mapping) - set(names.ignored))
    if missing or unexpected:
        raise CheckpointError(
            f"{weights.name}: keys do not match a {ckpt.config.num_layers}-layer {ckpt.config.family} encoder "
            f"(missing: {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected: {unexpected[:5]}{'...' if len(unexpected) > 5 else ''})"
        )
    with uninitialised_weights():
        encoder = family.build(cfg)
    own = encoder.state_dict()
    assert len(own) == len(mapping), "key map and Encoder disagree on the parameter count"
    for theirs, ours in mapping.items():
        if weights.shape(stored[theirs]) != tuple(own[ours].shape):
            raise CheckpointError(
                f"{weights.name}: {theirs} has shape {weights.shape(stored[theirs])}, expected {tuple(own[ours].shape)}"
            )
    del own
    # nn.Linear stores (out, in) exactly as HF does, so no transpose is needed.
    for theirs, ours in mapping.items():
        _assign(encoder, ours, weights.get(stored[theirs]), dtype)
    if family.after_load is not None:
        family.after_load(cfg, encoder)
    if ckpt.pipeline.multi_vector is not None:  # ColBERT: its token vectors are what the encoder gives
        return cast(EncoderModule, load_token_vectors(ckpt.directory, encoder, ckpt.pipeline))
    return cast(EncoderModule, encoder.eval())


def _assign(module: torch.nn.Module, key: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
    """module's parameter or persistent buffer `key` (a state_dict key) becomes tensor, as dtype where it is a
    float (an integer buffer keeps its type)."""
    *path, leaf = key.split(".")
    owner = module.get_submodule(".".join(path))
    current = owner._parameters.get(leaf)
    value = tensor.to(dtype) if tensor.is_floating_point() else tensor
    if current is not None:
        owner._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)
    elif leaf in owner._buffers:
        buffer = owner._buffers[leaf]
        owner._buffers[leaf] = value if buffer is None or not buffer.is_floating_point() else value.to(buffer.dtype)
    else:
        raise CheckpointError(f"{key} is neither a parameter nor a buffer of the encoder")
