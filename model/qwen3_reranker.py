"""Qwen3-Reranker: a Qwen3ForCausalLM whose relevance score is the probability that it answers "yes" rather than
"no" after a fixed chat template around the query and the document.

The model card computes softmax([logit_no, logit_yes])[1] at the last position, which is
sigmoid(logit_yes - logit_no); and logit_yes - logit_no = (lm_head[yes] - lm_head[no]) . h_last. So the graph needs
neither the vocabulary's other logits nor any position but the last: it returns that one difference per pair as
a raw score (B, 1), and the manifest's activation, sigmoid, makes it p(yes) (as sentence-transformers' CrossEncoder
does over its LogitScore: sigmoid(logit_true - logit_false)).

Which Qwen3ForCausalLM checkpoints are rerankers: those without sentence-transformers' modules.json. Qwen3-Reranker
ships none; Qwen3-Embedding, also a Qwen3ForCausalLM, ships its Transformer -> Pooling -> Normalize modules.

Shapes: B batch, T sequence, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from attnserve.errors import CheckpointError

from .pooling import pool
from .qwen3 import CAUSAL_LM, Qwen3Encoder
from .value_norms import keep_value_norms, stacked_value_norms
from .weights_files import Weights

# The model card's template: the pair is "{prefix}{body}{suffix}", the body formatted with the instruction, the
# query and the document. Each part is tokenized on its own, as the card does; only the body is ever truncated.
PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
          "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
BODY = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
ANSWERS = ("yes", "no")  # the tokens whose logits are compared, the relevant answer first


@dataclass(frozen=True)
class PairTemplate:
    prefix: str = PREFIX
    body: str = BODY  # with {instruction}, {query} and {document}
    suffix: str = SUFFIX
    instruction: str = INSTRUCTION

    def to_json(self) -> dict[str, str]:
        return {"prefix": self.prefix, "body": self.body, "suffix": self.suffix, "instruction": self.instruction}


def is_reranker(raw: dict[str, Any], directory: Path) -> bool:
    """A Qwen3ForCausalLM checkpoint without sentence-transformers modules (modules.json) scores pairs."""
    return (raw.get("model_type") == "qwen3" and (raw.get("architectures") or []) == [CAUSAL_LM]
            and not (directory / "modules.json").exists())


def answer_ids(tokenizer_file: Path) -> tuple[int, int]:
    """The token ids of "yes" and "no", each one whole token of the checkpoint's vocabulary."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as e:  # tokenizers raises a bare Exception for a bad file
        raise CheckpointError(f"tokenizer unreadable: {tokenizer_file}: {e}") from None
    yes, no = (tokenizer.token_to_id(answer) for answer in ANSWERS)
    if yes is None or no is None:
        missing = [a for a, i in zip(ANSWERS, (yes, no), strict=True) if i is None]
        raise CheckpointError(f"{tokenizer_file}: a Qwen3 reranker's vocabulary needs the tokens "
                              f"{' and '.join(map(repr, ANSWERS))}; {', '.join(map(repr, missing))} is not one")
    return yes, no


class Qwen3Reranker(nn.Module):
    """(B, T) ids and mask -> scores (B, 1) = logit_yes - logit_no at the last real token, and, for the attention
    graph, every layer's attention maps (L, B, nh, T, T)."""

    direction: torch.Tensor  # (H,) lm_head[yes] - lm_head[no]

    def __init__(self, encoder: Qwen3Encoder, direction: torch.Tensor, output_attentions: bool = False):
        super().__init__()
        self.encoder, self.output_attentions = encoder, output_attentions
        self.register_buffer("direction", direction.float(), persistent=False)

    def with_attentions(self) -> Qwen3Reranker:
        """The same weights, returning every layer's attention probabilities too."""
        return Qwen3Reranker(self.encoder, self.direction, output_attentions=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        keep_value_norms(self.encoder, self.output_attentions)
        hidden, attentions = self.encoder(input_ids, attention_mask, self.output_attentions)  # (B, T, H), final-normed
        last = pool(hidden, attention_mask, "lasttoken")  # (B, H): the position that predicts the answer
        scores = (last @ self.direction)[:, None]  # (B, 1)
        if self.output_attentions:  # with each head's value norms (L, B, nh, T): model/value_norms.py
            return scores, attentions, stacked_value_norms(self.encoder)
        return scores


def load_reranker(weights: Weights, tokenizer_file: Path, encoder: Qwen3Encoder, tied: bool) -> Qwen3Reranker:
    """The answer rows of lm_head (of the input embeddings where tie_word_embeddings is true, as transformers
    ties them) on top of a loaded encoder."""
    yes, no = answer_ids(tokenizer_file)
    if tied:
        rows = encoder.word.weight.detach()  # (V, H), the checkpoint's embed_tokens
    elif "lm_head.weight" in weights:
        rows = weights.get("lm_head.weight")  # (V, H) as stored: two of its rows are used
    else:
        raise CheckpointError(f"{weights.name}: tie_word_embeddings is false but there is no lm_head.weight "
                              f"(the reranker's answers are its rows {yes} and {no})")
    if tuple(rows.shape) != (encoder.config.vocab_size, encoder.config.hidden_size):
        raise CheckpointError(f"{weights.name}: lm_head.weight has shape {tuple(rows.shape)}, expected "
                              f"{(encoder.config.vocab_size, encoder.config.hidden_size)}")
    return Qwen3Reranker(encoder, rows[yes].float() - rows[no].float()).eval()


def tied_embeddings(raw: dict[str, Any], path: Path) -> bool:
    """config.json's tie_word_embeddings; transformers' Qwen3Config default: untied."""
    value = raw.get("tie_word_embeddings", False)
    if not isinstance(value, bool):
        raise CheckpointError(f"{path}: tie_word_embeddings must be true or false, got {value!r}")
    return value

