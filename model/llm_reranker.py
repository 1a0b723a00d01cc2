"""LLM rerankers: a causal LM whose relevance score is read off its next-token logits at the last position, after a
fixed template around the query and the document. Each is scored as its own reference scores it:

| kind | checkpoint | reference | score (raw) | activation |
|---|---|---|---|---|
| qwen3-reranker | Qwen3ForCausalLM | the model card's compute_logits | logit("yes") - logit("no") | sigmoid: p(yes) |
| mxbai-rerank-v2 | Qwen2ForCausalLM | mxbai-rerank's MxbaiRerankV2.predict | logit("1") - logit("0") | identity |
| bge-reranker-gemma | GemmaForCausalLM | FlagEmbedding's FlagLLMReranker.compute_score | logit("Yes") | identity |

Raw or not follows each reference's default: the card returns softmax([no, yes])[1] = sigmoid(yes - no);
MxbaiRerankV2.predict (and rank) return the logit difference unless asked to normalize (its sigmoid of the score less
a per-model constant, which no request here asks for); FlagLLMReranker returns the "Yes" logit unless built with
normalize=True (a sigmoid). A request's raw_scores gives the graph's score either way.

The graph needs neither the vocabulary's other logits nor any position but the last: logit(a) - logit(b) =
(lm_head[a] - lm_head[b]) . h_last, and logit(a) = lm_head[a] . h_last, so it returns that one product per pair (B, 1)
and the manifest names the activation.

Which checkpoints are LLM rerankers (recognise): a folder whose config.json's architectures is exactly one of the
causal LMs above and which has no sentence-transformers modules.json. That is how the published rerankers ship
(Qwen3-Reranker, mxbai-rerank-base-v2 and -large-v2, bge-reranker-v2-gemma: config.json, the weights, the
tokenizer; mxbai-rerank's MxbaiRerankV2 and FlagEmbedding's FlagLLMReranker load any such folder with
AutoModelForCausalLM), and how their embedders do not (Qwen3-Embedding and gte-Qwen2, also causal LMs, ship
Transformer -> Pooling -> Normalize). A causal-LM folder without modules.json but
with another sentence-transformers file is neither for sure, and is refused in one line.

How a pair becomes one text (the template, the manifest's pair_template), per kind:
- "body" (Qwen3-Reranker): "{prefix}{body}{suffix}", the body formatted with the instruction, the query and the
  document; each part tokenized on its own, only the body cut, to what max_seq_length leaves it.
- "query_document" (mxbai-rerank-v2, bge-reranker-v2-gemma): prefix + query's tokens + sep + document's tokens +
  suffix, each part tokenized on its own without special tokens, cut by the reference's max_length L: the query at
  L * 3 // 4 tokens, the document at min(L, document_budget - the query's tokens), then sep + document from its end
  so that the query and it (and the prefix where prefix_in_pair) hold at most L + pair_extra tokens (transformers'
  truncation "only_second"). engine/tokenizer.py applies it; served below the template's longest (the export's
  verified length), L shrinks until the longest pair fits: the reference run with that max_length. mxbai's prefix is
  its chat template's start, its suffix sep, its task prompt and the chat template's end; FlagLLMReranker's
  prefix is the tokenizer's bos token (counted in the pair; none where bos is the pad token), its query
  "A: {query}", its document "B: {document}", its suffix sep and its prompt.

Shapes: B batch, T sequence, H hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn

from attnserve.errors import CheckpointError

from .family import EncoderModule
from .pooling import pool
from .value_norms import keep_value_norms, stacked_value_norms
from .weights_files import Weights

# Qwen3-Reranker's model card: the pair is "{prefix}{body}{suffix}", the body formatted with the instruction, the
# query and the document.
PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
          "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
BODY = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

# mxbai-rerank 0.1.6's MxbaiRerankV2 (mxbai_rerank_v2.py): its chat template, prompts, separator and max_length.
MXBAI_CHAT_PREFIX = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                     "<|im_end|>\n<|im_start|>user\n")
MXBAI_CHAT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
MXBAI_TASK = ("You are a search relevance expert who evaluates how well documents match search queries. For each "
              "query-document pair, carefully analyze the semantic relationship between them, then provide your "
              "binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:")
MXBAI_SEP = "\n"
MXBAI_MAX_LENGTH = 8192  # MxbaiRerankV2's default max_length: the query, sep and document's tokens together

# FlagEmbedding 1.4.2's FlagLLMReranker (inference/reranker/decoder_only/base.py, abc/inference/AbsReranker.py): its
# default prompt, separator, query and passage instructions ("{}{}" formats) and max_length.
FLAG_PROMPT = ("Given a query A and a passage B, determine whether the passage contains an answer to the query by "
               "providing a prediction of either 'Yes' or 'No'.")
FLAG_SEP = "\n"
FLAG_MAX_LENGTH = 512  # compute_score's max_length: the passage's tokens; the query's max_length * 3 // 4


@dataclass(frozen=True)
class PairTemplate:
    """Qwen3-Reranker's "body" template."""

    prefix: str = PREFIX
    body: str = BODY  # with {instruction}, {query} and {document}
    suffix: str = SUFFIX
    instruction: str = INSTRUCTION

    def to_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "body": self.body, "suffix": self.suffix, "instruction": self.instruction}


@dataclass(frozen=True)
class QueryDocumentTemplate:
    """A template that tokenizes and cuts the query and the document apart (mxbai-rerank-v2); the module docstring
    says how. prefix and suffix are lists of texts, each tokenized on its own as the reference does."""

    prefix: tuple[str, ...]
    query: str  # with {query}
    sep: str
    document: str  # with {document}
    suffix: tuple[str, ...]
    max_length: int  # the reference's max_length L: the query keeps L * 3 // 4 tokens, the document L
    document_budget: int | None  # None: no budget beyond max_length
    pair_extra: int  # the query and the document (and the prefix where prefix_in_pair) hold L + pair_extra
    prefix_in_pair: bool  # whether the prefix's tokens count towards L + pair_extra
    longest: int  # the most tokens a pair can take (at most the positions): the manifest's max_seq_length

    def to_json(self) -> dict[str, Any]:
        return {"style": "query_document", **{k: list(v) if isinstance(v, tuple) else v
                                              for k, v in asdict(self).items()}}


@dataclass(frozen=True)
class Kind:
    """One LLM reranker: how it is recognised, which answers it compares, how its pairs are templated."""

    name: str
    model_type: str
    architecture: str  # config.json's architectures, exactly this one
    reference: str  # what scores it, for messages and the manifest's modules
    # the texts whose first tokens' logits are compared, the relevant answer first; None: the first's logit alone
    answers: tuple[str, str | None]
    whole_answers: bool  # True: each answer must be one whole token of the vocabulary (the card's lookup)
    activation: str  # the manifest's score_activation
    tied_default: bool  # tie_word_embeddings where config.json leaves it out (transformers' config class)
    # (the checkpoint's tokenizer, its folder, its positions) -> the template
    template: Callable[[Any, Path, int], PairTemplate | QueryDocumentTemplate]


def _qwen3_template(tokenizer, directory: Path, positions: int) -> PairTemplate:
    return PairTemplate()


def _counter(tokenizer) -> Callable[[str], int]:
    """A text's token count, tokenized alone without special tokens."""
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def _mxbai_template(tokenizer, directory: Path, positions: int) -> QueryDocumentTemplate:
    """MxbaiRerankV2.prepare_predefined_inputs and prepare_inputs: max_length shrinks so that it and the template's
    tokens fit the positions; the query keeps max_length * 3 // 4, the document what the positions leave (at most
    max_length), and the query, sep and document together max_length."""
    count = _counter(tokenizer)
    suffix = (MXBAI_SEP, MXBAI_TASK, MXBAI_CHAT_SUFFIX)
    predefined = count(MXBAI_CHAT_PREFIX) + sum(count(part) for part in suffix)  # the sep counted once, as there
    length = min(MXBAI_MAX_LENGTH, positions - predefined)
    if length < 4:
        raise CheckpointError(f"mxbai-rerank-v2's template takes {predefined} tokens of the model's {positions} "
                              "positions, leaving no room for a query and a document")
    return QueryDocumentTemplate(
        prefix=(MXBAI_CHAT_PREFIX,), query="query: {query}", sep=MXBAI_SEP, document="document: {document}",
        suffix=suffix, max_length=length, document_budget=positions - predefined, pair_extra=0, prefix_in_pair=False,
        longest=predefined + length)


def _flag_template(tokenizer, directory: Path, positions: int) -> QueryDocumentTemplate:
    """FlagLLMReranker.compute_score_single_gpu: the query ("A: " before it) cut at max_length * 3 // 4 tokens, the
    passage ("B: " before it) at max_length, then [bos] + query and sep + passage cut to max_length + sep + prompt
    ("only_second"), then sep and prompt. Pairs longer than the model's positions are refused, not cut otherwise."""
    count = _counter(tokenizer)
    bos = _special_token(directory, "bos_token")
    prefix: tuple[str, ...] = ()
    if bos is not None and bos != _special_token(directory, "pad_token"):
        if tokenizer.encode(bos, add_special_tokens=False).ids != [tokenizer.token_to_id(bos)]:
            raise CheckpointError(f"{directory}: the bos token {bos!r} is not one token of tokenizer.json")
        prefix = (bos,)
    suffix = (FLAG_SEP, FLAG_PROMPT)
    pair_max = FLAG_MAX_LENGTH + count(FLAG_SEP) + count(FLAG_PROMPT)
    overhead = len(prefix) + count(FLAG_SEP) + sum(count(part) for part in suffix)
    if positions - overhead < 4:
        raise CheckpointError(f"bge-reranker-gemma's template takes {overhead} tokens of the model's {positions} "
                              "positions, leaving no room for a query and a document")
    return QueryDocumentTemplate(
        prefix=prefix, query="A: {query}", sep=FLAG_SEP, document="B: {document}", suffix=suffix,
        max_length=FLAG_MAX_LENGTH, document_budget=None, pair_extra=pair_max - FLAG_MAX_LENGTH, prefix_in_pair=True,
        longest=min(pair_max + sum(count(part) for part in suffix), positions))


def _special_token(directory: Path, name: str) -> str | None:
    """A special token's text as transformers' tokenizer reads it: tokenizer_config.json's, else
    special_tokens_map.json's (a string, or an object with its content); None where neither names it."""
    from .checkpoint_files import read_object

    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / file
        value = read_object(path).get(name) if path.is_file() else None
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            if not isinstance(value, str):
                raise CheckpointError(f"{path}: {name} must be a string, got {value!r}")
            return value
    return None


KINDS = (
    Kind("qwen3-reranker", "qwen3", "Qwen3ForCausalLM", "Qwen3-Reranker's model card", ("yes", "no"), True,
         "sigmoid", False, _qwen3_template),
    Kind("mxbai-rerank-v2", "qwen2", "Qwen2ForCausalLM", "mxbai-rerank's MxbaiRerankV2", ("1", "0"), False,
         "identity", False, _mxbai_template),
    # FlagLLMReranker scores bge-reranker-v2-gemma with the "Yes" logit alone: no second answer.
    Kind("bge-reranker-gemma", "gemma", "GemmaForCausalLM", "FlagEmbedding's FlagLLMReranker", ("Yes", None), False,
         "identity", True, _flag_template),
)
SENTENCE_TRANSFORMERS_FILES = ("config_sentence_transformers.json", "sentence_bert_config.json")


def recognise(raw: dict[str, Any], directory: Path) -> Kind | None:
    """The LLM reranker a checkpoint is, None if it is none, or a one-line refusal where it cannot be told."""
    architectures = raw.get("architectures") or []
    kind = next((k for k in KINDS if raw.get("model_type") == k.model_type and architectures == [k.architecture]),
                None)
    if kind is None or (directory / "modules.json").exists():
        return None
    others = [name for name in SENTENCE_TRANSFORMERS_FILES if (directory / name).exists()]
    if others:
        raise CheckpointError(f"{directory}: cannot tell whether this {kind.architecture} folder is an LLM reranker "
                              f"({kind.name}: no modules.json) or a sentence-transformers model (it has "
                              f"{' and '.join(others)} but no modules.json); remove one or add the other")
    return kind


def answer_ids(kind: Kind, tokenizer_file: Path) -> tuple[int, int | None]:
    """The token ids of the kind's answers (None for an answer it does not have): each one whole token
    (Qwen3-Reranker's card looks them up as tokens), or the first token of each tokenized alone (mxbai-rerank's and
    FlagLLMReranker's tokenizer(answer, add_special_tokens=False)["input_ids"][0])."""
    tokenizer = _tokenizer(tokenizer_file)
    answers = [a for a in kind.answers if a is not None]
    if kind.whole_answers:
        ids = [tokenizer.token_to_id(answer) for answer in answers]
    else:
        ids = [(tokenizer.encode(answer, add_special_tokens=False).ids or [None])[0] for answer in answers]
    if None in ids:
        missing = [a for a, i in zip(answers, ids, strict=True) if i is None]
        raise CheckpointError(f"{tokenizer_file}: a {kind.name}'s vocabulary needs the tokens "
                              f"{' and '.join(map(repr, answers))}; {', '.join(map(repr, missing))} is not one")
    return ids[0], (ids[1] if len(ids) > 1 else None)


def pair_template(kind: Kind, tokenizer_file: Path, directory: Path, positions: int
                  ) -> PairTemplate | QueryDocumentTemplate:
    """The kind's template over this checkpoint's tokenizer and positions (a one-line refusal if it cannot fit)."""
    return kind.template(_tokenizer(tokenizer_file), directory, positions)


def _tokenizer(tokenizer_file: Path):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(tokenizer_file))
    except Exception as e:  # tokenizers raises a bare Exception for a bad file
        raise CheckpointError(f"tokenizer unreadable: {tokenizer_file}: {e}") from None


class LLMReranker(nn.Module):
    """(B, T) ids and mask -> scores (B, 1) = direction . h at the last real token, and, for the attention graph,
    every layer's attention maps (L, B, nh, T, T)."""

    direction: torch.Tensor  # (H,) lm_head[relevant] - lm_head[other], or lm_head[relevant] alone

    def __init__(self, encoder: EncoderModule, direction: torch.Tensor, output_attentions: bool = False):
        super().__init__()
        self.encoder, self.output_attentions = encoder, output_attentions
        self.register_buffer("direction", direction.float(), persistent=False)

    def with_attentions(self) -> LLMReranker:
        """The same weights, returning every layer's attention probabilities too."""
        return LLMReranker(self.encoder, self.direction, output_attentions=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        keep_value_norms(cast(nn.Module, self.encoder), self.output_attentions)
        hidden, attentions = self.encoder(input_ids, attention_mask, self.output_attentions)  # (B, T, H), final-normed
        last = pool(hidden, attention_mask, "lasttoken")  # (B, H): the position that predicts the answer
        scores = (last @ self.direction)[:, None]  # (B, 1)
        if self.output_attentions:  # with each head's value norms (L, B, nh, T): model/value_norms.py
            return scores, attentions, stacked_value_norms(cast(nn.Module, self.encoder))
        return scores


def load_reranker(weights: Weights, tokenizer_file: Path, encoder: EncoderModule, tied: bool,
                  kind: Kind = KINDS[0]) -> LLMReranker:
    """The answer rows of lm_head (of the input embeddings where tie_word_embeddings is true, as transformers
    ties them) on top of a loaded encoder."""
    yes, no = answer_ids(kind, tokenizer_file)
    if tied:
        rows = cast(nn.Embedding, cast(nn.Module, encoder).word).weight.detach()  # (V, H): embed_tokens
    elif "lm_head.weight" in weights:
        rows = weights.get("lm_head.weight")  # (V, H) as stored: one or two of its rows are used
    else:
        raise CheckpointError(f"{weights.name}: tie_word_embeddings is false but there is no lm_head.weight "
                              f"(the reranker's answers are its rows {yes}{'' if no is None else f' and {no}'})")
    if tuple(rows.shape) != (encoder.config.vocab_size, encoder.config.hidden_size):
        raise CheckpointError(f"{weights.name}: lm_head.weight has shape {tuple(rows.shape)}, expected "
                              f"{(encoder.config.vocab_size, encoder.config.hidden_size)}")
    direction = rows[yes].float() if no is None else rows[yes].float() - rows[no].float()  # (H,)
    return LLMReranker(encoder, direction).eval()


def tied_embeddings(raw: dict[str, Any], path: Path, kind: Kind = KINDS[0]) -> bool:
    """config.json's tie_word_embeddings, else the kind's config class's default."""
    value = raw.get("tie_word_embeddings", kind.tied_default)
    if not isinstance(value, bool):
        raise CheckpointError(f"{path}: tie_word_embeddings must be true or false, got {value!r}")
    return value
