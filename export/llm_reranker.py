"""LLM rerankers (model/llm_reranker.py) for export/reranker.py: the module and how its pairs are tokenized.

Their graphs are a cross-encoder's in every other way (export/reranker.py): inputs input_ids and attention_mask,
(B, T) int64 (no token types: the pair is one templated text); output scores (B, 1), the answers' logit difference
at the last real token, and attentions (L, B, nh, T, T) in the attention graph; the same variants, names,
verification and int8 search, on the real text pairs put through the reranker's template and tokenized as the server
tokenizes them.
"""

from __future__ import annotations

from collections.abc import Callable

from attnserve.engine.tokenizer import TextTokenizer, TokenizedInput
from attnserve.model.checkpoint import Checkpoint
from attnserve.model.checkpoint_files import read_json
from attnserve.model.family import EncoderModule
from attnserve.model.llm_reranker import LLMReranker, load_reranker, tied_embeddings


def load_templated_reranker(ckpt: Checkpoint, encoder: EncoderModule, tokenizer: TextTokenizer,
                            log: Callable[[str], None]
                            ) -> tuple[LLMReranker, Callable[[list[tuple[str, str]]], list[TokenizedInput]]]:
    kind = ckpt.llm_reranker
    assert kind is not None and ckpt.pair_template is not None, "read_checkpoint gives an LLM reranker its template"
    config = ckpt.directory / "config.json"
    tied = tied_embeddings(read_json(config), config, kind)
    reranker = load_reranker(ckpt.weights, ckpt.tokenizer_file, encoder, tied, kind)
    yes, no = kind.answers
    score = f"logit({yes})" + ("" if no is None else f" - logit({no})")
    log(f"reranker: {kind.name} as {kind.reference} scores it, {score} at the last token, from "
        f"{'the tied input embeddings' if tied else 'lm_head'}; activation {ckpt.score_activation}")
    template = ckpt.pair_template.to_json()
    return reranker, lambda pairs: tokenizer.encode_templated_pairs(pairs, template)
