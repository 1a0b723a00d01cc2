"""Requests of scores: a reranker's (rerank: each text against a query, best first; a ColBERT model ranks by
MaxSim), a classifier's (predict: each label of a text or pair), and the cosines of TEI's /similarity (one encode
request, its errors named as the similarity request names its inputs)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from attnserve.engine.manifest import Manifest
from attnserve.engine.multi_vector import MultiVectorTokenizer
from attnserve.engine.tokenizer import TextTokenizer, TokenizedInput, check_texts
from attnserve.errors import InputTooLongError, InvalidInputError

from .image_inputs import ImageBytes, ImageUrl
from .requests import (
    EncodeRequest,
    Input,
    RequestLimits,
    check_count,
    check_token_types,
    check_truncation_direction,
    flatten,
    invalid,
    located,
    tokenize,
    truncates,
)


@dataclass(frozen=True)
class RerankRequest:
    """Score each text against the query with a reranker (a cross-encoder) and sort them, best first."""

    query: str
    texts: Sequence[str]
    raw_scores: bool = False  # False: the model's CrossEncoder activation applied (a sigmoid for one label)
    return_text: bool = False
    truncate: bool | None = None  # False: a pair longer than max_seq_length is refused; None: as the server says
    truncation_direction: str | int = "right"
    top_n: int | None = None  # None: every text; more than there are texts: every text, as Cohere's API does
    model: str | None = None  # None: the server's default model
    # Cohere v2's: each text cut to its first N tokens (special tokens aside) before it is paired; None: uncut.
    max_tokens_per_doc: int | None = None


@dataclass(frozen=True)
class PredictRequest:
    """A classifier's scores for each input, a text or a sentence pair (TEI's /predict), every label sorted best
    first."""

    inputs: Sequence[str | tuple[str, str]]
    raw_scores: bool = False  # True: the logits; False: softmax, or sigmoid for multi-label (transformers' rule)
    truncate: bool | None = None  # False: an input longer than max_seq_length is refused; None: as the server says
    truncation_direction: str | int = "right"
    model: str | None = None  # None: the server's default model


@dataclass(frozen=True)
class PreparedPredict:
    inputs: list[TokenizedInput]  # in the request's order
    raw_scores: bool

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.inputs)


def prepare_predict(request: PredictRequest, tokenizer: TextTokenizer, manifest: Manifest, limits: RequestLimits,
                    takes_token_types: bool) -> PreparedPredict:
    """Check a predict request before it costs compute and tokenize its texts and pairs."""
    if manifest.kind != "reranker" or manifest.pair_template is not None:
        what = ("an embedding model: it has no classifier" if manifest.kind != "reranker" else
                "a reranker that scores a templated (query, document) pair: ask rerank")
        raise invalid("model", f"{manifest.model} is {what}; predict needs a model with a sequence-classification "
                               "head (a *ForSequenceClassification checkpoint)")
    direction = check_truncation_direction(request.truncation_direction)
    check_count(len(request.inputs), limits.max_inputs)
    inputs, _ = flatten(tokenize(EncodeRequest(inputs=request.inputs), tokenizer, manifest,
                                 truncates(request.truncate, limits), direction, images=False))
    check_token_types(inputs, takes_token_types, manifest)
    return PreparedPredict(cast(list[TokenizedInput], inputs), request.raw_scores)  # texts: images refused


@dataclass(frozen=True)
class SimilarityRequest:
    """The cosine of each sentence's embedding with the source sentence's (TEI's /similarity), all of them encoded
    in one request through the batcher."""

    source_sentence: Input  # a text, or (an image-text model's) an image
    sentences: Sequence[Input]
    truncate: bool | None = None  # False: an input longer than max_seq_length is refused; None: as the server says
    truncation_direction: str | int = "right"
    prompt_name: str | None = None
    prompt: str | None = None
    model: str | None = None  # None: the server's default model

    def to_encode(self) -> EncodeRequest:
        """The source sentence first, then the sentences: one encode request (checked as any is)."""
        if not isinstance(self.source_sentence, str | ImageBytes | ImageUrl):
            raise invalid("source_sentence", "source_sentence must be a string")
        if not isinstance(self.sentences, Sequence) or isinstance(self.sentences, str):
            raise invalid("sentences", "sentences must be a list of strings")
        if not self.sentences:
            raise invalid("sentences", "no sentences: send 1 or more to compare with source_sentence")
        for i, sentence in enumerate(self.sentences):
            if not isinstance(sentence, str | ImageBytes | ImageUrl):
                raise invalid(f"sentences[{i}]", "must be a string", label=f"sentence {i}")
        return EncodeRequest(inputs=[self.source_sentence, *self.sentences], normalize=True, truncate=self.truncate,
                             truncation_direction=self.truncation_direction, prompt_name=self.prompt_name,
                             prompt=self.prompt, model=self.model)


def similarity_error(error: InvalidInputError) -> InvalidInputError:
    """An error about the encode request of a SimilarityRequest, named as the similarity request names its
    inputs: input 0 is source_sentence, input i + 1 is sentence i; "inputs" is the sentences."""
    field, message = error.field or "", str(error)
    match = re.match(r"inputs\[(\d+)\](.*)", field)
    if match:
        row = int(match.group(1))
        field = "source_sentence" if row == 0 else f"sentences[{row - 1}]"
        label = "source_sentence" if row == 0 else f"sentence {row - 1}"
        message = re.sub(rf"^input {row}(?=:)", label, message)
    elif field == "inputs":
        field = "sentences"
        message = message.replace("inputs", "sentences (with source_sentence)", 1)
    if isinstance(error, InputTooLongError):
        return InputTooLongError(message, field=field, description=error.description,
                                 server_default=error.server_default)
    return InvalidInputError(message, field=field, description=error.description)


@dataclass(frozen=True)
class PreparedRerank:
    inputs: list[TokenizedInput]  # the pairs (query, text i), in the request's order
    texts: Sequence[str]
    raw_scores: bool
    return_text: bool
    top_n: int  # how many results the reply holds

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.inputs)


def prepare_rerank(request: RerankRequest, tokenizer: TextTokenizer, manifest: Manifest, limits: RequestLimits,
                   takes_token_types: bool) -> PreparedRerank:
    """Check a rerank request before it costs compute and tokenize its pairs (query, text)."""
    if manifest.kind != "reranker":
        raise invalid("model", f"{manifest.model} is an embedding model, not a reranker (a cross-encoder) or a "
                               "multi-vector (ColBERT) model: it cannot rerank; ask a reranker, or embed the texts "
                               "and compare them")
    if manifest.num_labels != 1:
        raise invalid("model", f"{manifest.model} is a classifier with {manifest.num_labels} labels; reranking "
                               "needs one score per pair (one label)")
    top_n, direction = _check_rerank(request, limits)
    labels = [f"text {i}" for i in range(len(request.texts))]
    try:
        check_texts(request.texts, labels)  # named as the request names them, not as sides of pairs
        texts = _first_tokens(request.texts, tokenizer, request.max_tokens_per_doc, labels)
        pairs = [(request.query, text) for text in texts]
        if manifest.pair_template is not None:  # one templated text per pair (an LLM reranker)
            inputs = tokenizer.encode_templated_pairs(pairs, manifest.pair_template,
                                                      truncates(request.truncate, limits), labels, direction)
        else:
            inputs = tokenizer.encode_pairs(pairs, truncates(request.truncate, limits), labels, direction)
    except InvalidInputError as error:
        raise located(error, labels, [f"texts[{i}]" for i in range(len(request.texts))],
                      request.truncate is None) from None
    check_token_types(inputs, takes_token_types, manifest)
    return PreparedRerank(inputs, request.texts, request.raw_scores, request.return_text,
                          min(top_n, len(request.texts)))


def _first_tokens(texts: Sequence[str], tokenizer: TextTokenizer, most: int | None,
                  labels: Sequence[str]) -> Sequence[str]:
    """Each text cut after its first `most` tokens (Cohere v2's max_tokens_per_doc), at the end of the last token's
    characters; None: the texts as they are. Tokenizing whole costs what the request's size allows."""
    if most is None:
        return texts
    out = []
    for text, tokens in zip(texts, tokenizer.token_spans(texts, add_special_tokens=False, labels=labels),
                            strict=True):
        words = [t for t in tokens if not t.special]
        out.append(text if len(words) <= most else text[:words[most - 1].stop])
    return out


def _check_rerank(request: RerankRequest, limits: RequestLimits) -> tuple[int, str]:
    """What every rerank request must be, whatever scores it; returns top_n, as asked (maybe over the texts), and
    the truncation direction."""
    if not isinstance(request.texts, Sequence) or isinstance(request.texts, str):
        raise invalid("texts", "texts must be a list of strings")
    check_count(len(request.texts), limits.max_inputs, "texts")
    top_n = len(request.texts) if request.top_n is None else request.top_n
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise invalid("top_n", f"top_n {request.top_n!r} is not a positive integer (ask for 1 or more results)")
    most = request.max_tokens_per_doc
    if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
        raise invalid("max_tokens_per_doc", f"max_tokens_per_doc {most!r} is not a positive integer")
    direction = check_truncation_direction(request.truncation_direction)
    if not isinstance(request.query, str) or not request.query or request.query.isspace():
        raise invalid("query", "the query must be a non-empty string", label="query")
    return top_n, direction


def prepare_multi_vector_rerank(request: RerankRequest, multi_vector: MultiVectorTokenizer, limits: RequestLimits
                                ) -> PreparedRerank:
    """A rerank request to a ColBERT model (ranked by MaxSim): the query as a query, then each text as a document."""
    top_n, direction = _check_rerank(request, limits)
    if direction != "right":
        raise invalid("truncation_direction", "a multi-vector model's queries and documents are cut at their end "
                                              "(truncation_direction right), as sentence-transformers cuts them")
    truncate = truncates(request.truncate, limits)
    labels = [f"text {i}" for i in range(len(request.texts))]
    try:
        query = multi_vector.encode([request.query], "query", truncate, ["query"])
        documents = multi_vector.encode(request.texts, "document", truncate, labels)
    except InvalidInputError as error:
        raise located(error, ["query", *labels], ["query", *(f"texts[{i}]" for i in range(len(labels)))],
                      request.truncate is None) from None
    return PreparedRerank([*query, *documents], request.texts, request.raw_scores, request.return_text,
                          min(top_n, len(request.texts)))
