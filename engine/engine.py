"""The engine shared by the server and offline encoding: tokenize, plan batches, run a session, pool."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnserve.config import EngineConfig
from attnserve.errors import ArtifactError, ConfigError

from .batching import pad, plan_batches
from .manifest import GraphVariant, Manifest, load_manifest
from .pooling import l2_normalize
from .session import CPU, CUDA, open_session, resolve_provider
from .tokenizer import TextTokenizer, TokenizedInput

# Which graph serves each precision: the fused fp32 graph is the fastest exact one.
EMBEDDINGS_VARIANT = {"fp32": "embeddings_fused", "int8": "embeddings_int8", "fp16": "embeddings_fp16"}
ATTENTION_VARIANT = "attention"


@dataclass
class BatchOutput:
    """One session run over a padded batch, rows in the order given."""

    lengths: np.ndarray  # (B,) real token counts
    last_hidden_state: np.ndarray  # (B, T, H), padded positions are not meaningful
    sentence_embedding: np.ndarray  # (B, H), the model's pooling, not normalised
    attentions: np.ndarray | None = None  # (L, B, nh, T, T) when the attention graph ran


@dataclass
class EncodeStats:
    texts: int = 0
    tokens: int = 0
    cells: int = 0  # token cells computed, padding included
    seconds: float = 0.0

    @property
    def padding_fraction(self) -> float:
        return (self.cells - self.tokens) / self.cells if self.cells else 0.0

    def add(self, other: EncodeStats) -> None:
        self.texts += other.texts
        self.tokens += other.tokens
        self.cells += other.cells
        self.seconds += other.seconds


@dataclass
class Encoded:
    embeddings: np.ndarray  # (N, H) float32, in input order
    num_tokens: np.ndarray  # (N,) int32
    truncated: np.ndarray  # (N,) bool
    stats: EncodeStats = field(default_factory=EncodeStats)


def embeddings_graph(manifest: Manifest, config: EngineConfig) -> tuple[str, str, GraphVariant]:
    """(provider, precision, graph) that an engine with `config` runs, without opening a session."""
    provider = resolve_provider(config.provider)
    precision = config.precision if config.precision != "auto" else ("fp16" if provider == CUDA else "fp32")
    if precision == "int8" and provider == CUDA:
        # Dynamic int8 ops have CPU kernels only: on CUDA they would silently run on the CPU.
        raise ConfigError("the int8 graph is for the CPU provider; on CUDA use fp16 or fp32")
    variant_name = EMBEDDINGS_VARIANT[precision]
    if variant_name not in manifest.variants:
        raise ArtifactError(f"{manifest.directory} has no {precision} graph ({variant_name}); re-export")
    return provider, precision, manifest.variants[variant_name]


class Engine:
    def __init__(self, manifest: Manifest, config: EngineConfig, attention: bool = False):
        self.manifest, self.config = manifest, config
        if config.max_batch_tokens < manifest.max_seq_length:
            raise ConfigError(
                f"max_batch_tokens {config.max_batch_tokens} is below max_seq_length {manifest.max_seq_length}")
        self.provider, self.precision, self.embeddings_variant = embeddings_graph(manifest, config)
        self.tokenizer = TextTokenizer(manifest.path(manifest.tokenizer), manifest.max_seq_length, manifest.vocab_size)
        self._session = open_session(manifest.path(self.embeddings_variant.file), self.provider, config.threads)
        # Graphs of models with token types take token_type_ids (export/torch_to_onnx.py); older exports do not.
        self._takes_token_types = "token_type_ids" in {i.name for i in self._session.get_inputs()}
        self._attention_session = None
        self._attention_lock = threading.Lock()
        if attention:
            self._open_attention_session()

    @classmethod
    def from_directory(cls, directory: str | Path, config: EngineConfig | None = None, attention: bool = False
                       ) -> Engine:
        return cls(load_manifest(directory), config or EngineConfig(), attention)

    def _open_attention_session(self):
        with self._attention_lock:
            if self._attention_session is None:
                variant = self.manifest.variants.get(ATTENTION_VARIANT)
                if variant is None:
                    raise ArtifactError(f"{self.manifest.directory} has no attention graph; re-export")
                # Its intermediates grow with tokens^2 per batch: an arena would keep a burst's peak (about
                # 250 MB for MiniLM) for the process's life. Without it, runs measured no slower.
                self._attention_session = open_session(
                    self.manifest.path(variant.file), self.provider, self.config.threads, arena=False)
        return self._attention_session

    def _feed(self, inputs: Sequence[TokenizedInput]) -> dict[str, np.ndarray]:
        """The graph's inputs for one padded batch, each (B, T) int64. A graph that takes token_type_ids
        (a model with token types) gets the inputs' own, or zeros for inputs that carry none."""
        ids, mask = pad([x.ids for x in inputs])
        feed = {"input_ids": ids, "attention_mask": mask}
        if self._takes_token_types:
            types = np.zeros_like(ids)
            for row, x in enumerate(inputs):
                if x.type_ids is not None:
                    types[row, : len(x.type_ids)] = x.type_ids
            feed["token_type_ids"] = types
        return feed

    def run(self, inputs: Sequence[TokenizedInput], attention: bool = False) -> BatchOutput:
        """One padded batch through one session; safe to call from several threads."""
        feed = self._feed(inputs)
        lengths = feed["attention_mask"].sum(axis=1)
        if attention:
            hidden, sentence, attentions = self._open_attention_session().run(None, feed)
            return BatchOutput(lengths, hidden, sentence, attentions)
        hidden, sentence = self._session.run(["last_hidden_state", "sentence_embedding"], feed)
        return BatchOutput(lengths, hidden, sentence)

    def _sentence_embeddings(self, inputs: Sequence[TokenizedInput]) -> np.ndarray:
        return self._session.run(["sentence_embedding"], self._feed(inputs))[0]

    def encode_tokenized(self, inputs: Sequence[TokenizedInput], normalize: bool | None = None,
                         on_batch: Callable[[int], None] | None = None) -> Encoded:
        """Sentence embeddings of many inputs, batched by length; rows come back in input order.

        on_batch(n) is called after each batch of n inputs ran: progress for callers that show it."""
        start = time.perf_counter()
        lengths = np.fromiter((len(x) for x in inputs), dtype=np.int64, count=len(inputs))
        batches = plan_batches(lengths, self.config.max_batch_tokens, self.config.max_batch_size)
        embeddings = np.empty((len(inputs), self.manifest.hidden_size), dtype=np.float32)
        cells = 0
        for batch in batches:
            embeddings[batch] = self._sentence_embeddings([inputs[i] for i in batch])
            cells += int(lengths[batch].max()) * len(batch)
            if on_batch is not None:
                on_batch(len(batch))
        if self.manifest.normalize if normalize is None else normalize:  # None: as the checkpoint does
            embeddings = l2_normalize(embeddings)
        stats = EncodeStats(len(inputs), int(lengths.sum()), cells, time.perf_counter() - start)
        truncated = np.fromiter((x.truncated for x in inputs), dtype=bool, count=len(inputs))
        return Encoded(embeddings, lengths.astype(np.int32), truncated, stats)

    def encode(self, texts: Sequence[str], normalize: bool | None = None, truncate: bool = True) -> Encoded:
        return self.encode_tokenized(self.tokenizer.encode_texts(texts, truncate=truncate), normalize)

    def describe(self) -> str:
        provider = "CUDA" if self.provider == CUDA else "CPU" if self.provider == CPU else self.provider
        return f"{self.manifest.model} · {self.precision} ({self.embeddings_variant.file}) on {provider}"
