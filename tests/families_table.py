"""The family conformance suite's table (tests/test_family_conformance.py): one row per model family, saying how to
save its tiny checkpoint with transformers' own class, the sentence-transformers pipeline over it, and what sets the
family apart where a shared check needs to know it (padding side, token types, windows, head classes, variants).

A new family is a row here (and its tiny saver in a tiny_*.py), not a test file.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from .checkpoints import save_sentence_transformer, save_tiny_family, save_tiny_modernbert
from .tiny_deberta import save_tiny_deberta
from .tiny_decoders import save_decoder_embedder, save_tiny_decoder
from .tiny_eurobert import save_tiny_eurobert
from .tiny_gemma3 import save_bge_gemma2, save_embedding_gemma, save_tiny_gemma, save_tiny_gemma2, save_tiny_gemma3
from .tiny_gte import save_tiny_gte
from .tiny_jina import save_tiny_jina
from .tiny_nomic import save_tiny_nomic
from .tiny_qwen3 import save_qwen3_embedding, save_tiny_qwen3

# Upper case, accents, pieces outside the tiny vocabularies, whitespace runs, a text past every max_seq_length, and
# CJK and emoji (several byte-level tokens each).
TEXTS = ["hello world", "A LONGER sentence, with punctuation!", "café über naïve 42", "x",
         "the quick brown fox jumps over the lazy dog " * 12, "   spaced    out [MASK] text\t\ttabs  ",
         "東京は日本の首都です。🙂🚀 and some more words after it"]
FP32 = ("embeddings", "embeddings_fused")  # a row's export, unless the row is its architecture kind's (EVERY)
EVERY = None  # every variant: fp16, int8 and the attention graphs, each verified
# The tasks' graphs hold what differs by task; int8, whose recipe search measures many candidates, is built once,
# for the model without a task: the same graph code quantizes every task's.
JINA_VARIANTS = ("embeddings", "embeddings_fused", "embeddings_fp16", "attention", "attention_last")


def _pooled(pooling: str, normalize: bool, max_seq_length: int, prompts: dict | None = None):
    """sentence-transformers' Transformer -> Pooling [-> Normalize] with `prompts`, over a model folder."""
    return partial(save_sentence_transformer, pooling=pooling, normalize=normalize, max_seq_length=max_seq_length,
                   **({"prompts": prompts} if prompts else {}))


def _jina_pipeline(model_dir: Path, st_dir: Path) -> Path:
    """sentence-transformers' own save writes the transformers model, not the PEFT folders: they are copied beside."""
    save_sentence_transformer(model_dir, st_dir, "mean", normalize=True, max_seq_length=40)
    shutil.copytree(model_dir / "adapters", st_dir / "adapters")
    return st_dir


@dataclass(frozen=True)
class Row:
    name: str  # config.json's model_type (model/families.py FAMILIES)
    save: Callable[..., Path]  # (directory, model_class=..., seed=..., **config) -> the transformers folder
    pipeline: Callable[[Path, Path], Path]  # (transformers folder, folder) -> sentence-transformers' save over it
    max_seq_length: int
    expect: dict[str, Any]  # our config's fields, as transformers reads the tiny config
    prompts: tuple[str, ...] = ()  # prompt names encoded with, besides none
    sides: tuple[str, ...] = ("right",)  # padding sides compared with transformers (left: a decoder's tokenizer)
    implementations: tuple[str, ...] = ("eager", "sdpa")
    token_types: bool = False  # the graphs take token_type_ids
    first_id: int = 4  # random ids are drawn from here up (below: the specials)
    positions: int = 128  # the longest row a random batch may have
    causal: bool = False
    window: tuple[tuple[int, ...], int] | None = None  # (windowed layers, keys either side of a query)
    wide_weights: bool = True  # drawn wider than transformers' init: attention is peaked, not uniform
    variants: tuple[str, ...] | None = FP32
    masked_lm: str | None = None  # a head class whose checkpoint loads as its encoder
    refused_head: str | None = None  # a head class refused by its architecture
    head_weights_refused: bool = False  # ... and, with the architecture renamed away, by its weights
    fused: bool | None = None  # what the manifest says of embeddings_fused (None: not checked)
    extra: dict[str, Any] = field(default_factory=dict)


BERT_LIKE = dict(max_seq_length=48, positions=64, wide_weights=False, fused=True)
ROWS = [
    Row("bert", partial(save_tiny_family, family="bert"), _pooled("mean", False, 48), token_types=True,
        expect={"type_vocab_size": 2}, **BERT_LIKE),
    Row("roberta", partial(save_tiny_family, family="roberta"), _pooled("mean", False, 48),
        expect={"positions_after_padding": True}, masked_lm="RobertaForMaskedLM", **BERT_LIKE),
    Row("xlm-roberta", partial(save_tiny_family, family="xlm-roberta"), _pooled("mean", False, 48),
        expect={"pad_token_id": 1}, masked_lm="XLMRobertaForMaskedLM", **BERT_LIKE),
    Row("distilbert", partial(save_tiny_family, family="distilbert"), _pooled("mean", False, 48),
        expect={"type_vocab_size": 0}, masked_lm="DistilBertForMaskedLM", **BERT_LIKE),
    Row("mpnet", partial(save_tiny_family, family="mpnet"), _pooled("mean", False, 48), implementations=("eager",),
        expect={"relative_attention_buckets": 32}, masked_lm="MPNetForMaskedLM",
        **{**BERT_LIKE, "fused": False}),  # its position bias stops the Attention fusion
    Row("gte", save_tiny_gte, _pooled("cls", True, 48, {"query": "query: "}), 48, prompts=("query",),
        expect={"rope_theta": 10_000.0, "ntk_factor": 1.0, "activation": "gelu", "type_vocab_size": 0,
                "qkv_bias": True, "out_bias": True, "up_bias": False, "down_bias": True},
        masked_lm="GteForMaskedLM", refused_head="GteForSequenceClassification"),
    Row("nomic_bert", save_tiny_nomic, _pooled("mean", True, 48, {
        "query": "search_query: ", "document": "search_document: ", "clustering": "clustering: "}), 48,
        prompts=("query", "document"), token_types=True, variants=EVERY,
        expect={"head_size": 16, "rope_theta": 1000.0, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
                "qkv_bias": False, "out_bias": False, "up_bias": False, "down_bias": False},
        masked_lm="NomicBertForMaskedLM", refused_head="NomicBertForSequenceClassification"),
    Row("modernbert", save_tiny_modernbert, _pooled("mean", True, 40), 40, window=((1, 2), 4), variants=EVERY,
        expect={"layer_types": ("full_attention", "sliding_attention", "sliding_attention", "full_attention"),
                "half_window": 4, "global_rope_theta": 1000.0, "local_rope_theta": 100.0, "norm_bias": False,
                "attention_bias": False, "mlp_bias": False},
        masked_lm="ModernBertForMaskedLM", refused_head="ModernBertForTokenClassification",
        head_weights_refused=True, fused=False),
    Row("deberta-v2", save_tiny_deberta, _pooled("mean", True, 48), 48, masked_lm="DebertaV2ForMaskedLM",
        variants=EVERY,  # its own kind: disentangled attention
        implementations=("eager",),  # transformers runs DeBERTa eager only
        expect={"position_buckets": 16, "max_relative_positions": 64, "span": 16, "position_terms": ("p2c", "c2p"),
                "norm_relative_embeddings": True, "position_biased_input": False, "type_vocab_size": 0},
        refused_head="DebertaV2ForTokenClassification"),
    Row("eurobert", save_tiny_eurobert, _pooled("mean", True, 40, {"query": "query: ", "document": "passage: "}), 40,
        prompts=("query",), first_id=3,
        expect={"num_kv_heads": 2, "head_size": 32, "rope_theta": 1000.0, "activation": "silu",
                "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-5},
        masked_lm="EuroBertForMaskedLM", refused_head="EuroBertForSequenceClassification",
        head_weights_refused=True),
    Row("qwen3", save_tiny_qwen3, partial(save_qwen3_embedding, max_seq_length=40), 40,
        prompts=("query", "document"), sides=("right", "left"), causal=True, variants=EVERY,
        expect={"num_kv_heads": 2, "head_size": 32, "rope_theta": 1000.0, "rms_norm_eps": 1e-6,
                "attention_bias": False, "hidden_act": "silu"}),
    *[Row(name, partial(save_tiny_decoder, family=name), partial(save_decoder_embedder, family=name,
                                                                  max_seq_length=40), 40,
          prompts=prompts, sides=("right", "left"), causal=True, first_id=first_id, masked_lm=f"{title}ForCausalLM",
          expect={"num_kv_heads": 2, "head_size": 32, "rope_theta": 1000.0, "rms_norm_eps": 1e-6, **expect})
      for name, title, prompts, first_id, expect in [
          ("llama", "Llama", (), 2, {"attention_bias": True, "out_bias": True, "mlp_bias": False,
                                     "sliding_window": None}),
          ("mistral", "Mistral", ("query",), 2, {"attention_bias": False, "out_bias": False, "sliding_window": 24}),
          ("qwen2", "Qwen2", (), 4, {"attention_bias": True, "out_bias": False, "mlp_bias": False})]],
    Row("gemma3_text", save_tiny_gemma3, partial(save_embedding_gemma, max_seq_length=40), 40,
        prompts=("query", "document"), window=((0, 2, 3), 4), variants=EVERY,
        expect={"layer_types": ("sliding_attention", "full_attention", "sliding_attention", "sliding_attention"),
                "sliding_window": 8, "bidirectional": True, "num_kv_heads": 2, "head_size": 32,
                "score_divisor": 24 ** 0.5, "global_rope_theta": 1000.0, "local_rope_theta": 100.0}),
    Row("gemma2", save_tiny_gemma2, partial(save_bge_gemma2, max_seq_length=40), 40, prompts=("query",),
        sides=("right", "left"), causal=True, implementations=("eager",),  # transformers runs Gemma 2 eager only
        masked_lm="Gemma2ForCausalLM", variants=EVERY,  # its own kind: soft-capped scores
        expect={"layer_types": ("sliding_attention", "full_attention", "sliding_attention", "full_attention"),
                "sliding_window": 8, "attn_logit_softcapping": 2.0, "num_kv_heads": 2, "head_size": 32,
                "score_divisor": 24 ** 0.5, "global_rope_theta": 1000.0, "local_rope_theta": 1000.0}),
    # Gemma (v1): no published embedder; the row checks the encoder under bge-reranker-v2-gemma (an LLM reranker,
    # tests/test_llm_rerankers.py), here pooled as Gemma 2's embedder is.
    Row("gemma", save_tiny_gemma, _pooled("lasttoken", True, 40), 40, sides=("right", "left"), causal=True,
        masked_lm="GemmaForCausalLM", refused_head="GemmaForSequenceClassification",
        expect={"layer_types": ("full_attention",) * 3, "num_kv_heads": 1, "head_size": 32,
                "score_divisor": 32 ** 0.5, "global_rope_theta": 1000.0, "activation": "gelu_pytorch_tanh",
                "attention_bias": False, "rms_norm_eps": 1e-6}),
    Row("jina_embeddings_v3", save_tiny_jina, _jina_pipeline, 40, variants=JINA_VARIANTS,
        expect={"rope_theta": 1000.0, "task": None}, extra={"add_variants": ["embeddings_int8"]}),
]
BY_NAME = {row.name: row for row in ROWS}
