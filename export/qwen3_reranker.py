"""Qwen3-Reranker (model/qwen3_reranker.py) for export/reranker.py: the module and how its pairs are tokenized.

Its graphs are a cross-encoder's in every other way (export/reranker.py): inputs input_ids and attention_mask,
(B, T) int64 (no token types: the pair is one templated text); output scores (B, 1), logit_yes - logit_no at the
last real token, and attentions (L, B, nh, T, T) in the attention graph; the same variants, names, verification and
int8 search, on the real text pairs put through the model card's template and tokenized as the server tokenizes
them.
"""

from __future__ import annotations

from collections.abc import Callable

from attnserve.engine.tokenizer import TextTokenizer, TokenizedInput
from attnserve.model.checkpoint import Checkpoint
from attnserve.model.checkpoint_files import read_json
from attnserve.model.family import EncoderModule
from attnserve.model.qwen3 import Qwen3Encoder
from attnserve.model.qwen3_reranker import Qwen3Reranker, load_reranker, tied_embeddings


def load_templated_reranker(ckpt: Checkpoint, encoder: EncoderModule, tokenizer: TextTokenizer,
                            log: Callable[[str], None]
                            ) -> tuple[Qwen3Reranker, Callable[[list[tuple[str, str]]], list[TokenizedInput]]]:
    assert ckpt.pair_template is not None, "read_checkpoint gives a Qwen3 reranker its template"
    assert isinstance(encoder, Qwen3Encoder), "read_checkpoint gives a pair template to Qwen3 rerankers only"
    config = ckpt.directory / "config.json"
    tied = tied_embeddings(read_json(config), config)
    reranker = load_reranker(ckpt.weights, ckpt.tokenizer_file, encoder, tied)
    log(f"reranker: logit(yes) - logit(no) at the last token, from "
        f"{'the tied input embeddings' if tied else 'lm_head'}; activation {ckpt.score_activation}")
    template = ckpt.pair_template.to_json()
    return reranker, lambda pairs: tokenizer.encode_templated_pairs(pairs, template)
