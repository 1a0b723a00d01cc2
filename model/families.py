"""The one family registry: every model family attnserve reads, keyed by config.json's model_type.

A family is a family.Family declared in its own file (the BERT-likes as rows of bert_likes.py); adding one is that
file and one line here (docs/development.md, "Adding a model family").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnserve.errors import CheckpointError

from . import (
    bert_likes,
    clip,
    deberta_v2,
    eurobert,
    gemma,
    gemma2,
    gemma3,
    gte,
    jina_v3,
    llama,
    modernbert,
    nomic_bert,
    nvembed,
    qwen3,
)
from .family import Family, ModelConfig

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    *bert_likes.FAMILIES,  # bert, roberta, xlm-roberta, distilbert, mpnet
    modernbert.FAMILY,
    deberta_v2.FAMILY,
    gemma3.FAMILY,
    gemma2.FAMILY,
    gemma.FAMILY,
    eurobert.FAMILY,
    nomic_bert.FAMILY,
    gte.FAMILY,
    gte.PUBLISHED_FAMILY,  # model_type "new": GTE v1.5 as published, for its remote code
    jina_v3.FAMILY,
    qwen3.FAMILY,
    *llama.FAMILIES,  # llama, mistral, qwen2, llama_bidirec: decoder embedders
    nvembed.FAMILY,  # NV-Embed: a bidirectional Mistral and its latent attention layer
    *clip.FAMILIES,  # clip, siglip: the text tower (the image tower beside it: export/image_tower.py)
)}


def family_of(raw: Any, path: Path) -> Family:
    """The family of a config.json's contents, or a one-line refusal naming the ones there are."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    family = FAMILIES.get(str(raw.get("model_type")))
    if family is None:
        raise CheckpointError(f"{path}: model_type {raw.get('model_type')!r} is not supported (only "
                              f"{', '.join(FAMILIES)})")
    return family


def key_map(cfg: ModelConfig) -> dict[str, str]:
    """Checkpoint key (the family's transformers naming) -> encoder key, for any family's config."""
    return FAMILIES[cfg.family].key_map(cfg)
