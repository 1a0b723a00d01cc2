"""Parity of every exported graph against the PyTorch encoder; used at export time and in tests.

Each variant is run on a grid of batch sizes and sequence lengths (rows of random lengths, so padding is
exercised, and random segments where the model has token types) and on real texts, and compared with the PyTorch
encoder on the same inputs. The grid puts every batch size at the short lengths and a few rows at the model's own
max_seq_length (shape_grid): the errors that verification exists to find (a mask path gone from the graph, a
position table cut short, a dynamic axis made fixed, fp16 overflowing at the longest positions) show in a few rows
at the full length as in many, and batch sizes show at any length, so a full batch at the full length adds rows of
the same kind at most of the cost (all-mpnet-base-v2: 17 x 384 of the grid's 11,600 tokens a variant were 56%,
and more of its time: attention is quadratic). The full length stays in the grid for every variant: a test at a
shortened length once hid a failing export.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np
import onnx
import torch

from attnserve.attention_analyses import rollout_of_means
from attnserve.engine.batching import pad, plan_batches
from attnserve.engine.session import CHECK_SPIN, CPU, ONNXRUNTIME, open_graph
from attnserve.engine.token_ids import made_up_token_ids
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.errors import ExportVerificationError
from attnserve.model.encoder import Encoder
from attnserve.model.family import EncoderModule
from attnserve.model.fused_attention import fused_attention
from attnserve.model.value_norms import keep_value_norms, stacked_value_norms

from .attention_last import LAST_MAPS, ROLLOUT
from .memory import release_freed_memory, small_heaps

SAMPLE_TEXTS = Path(__file__).parent / "data" / "sample_texts.txt"
BATCH_SIZES = (1, 2, 5, 17)
SHORT_LENGTHS = (1, 2, 13, 64)  # every batch size runs at each of these (those up to max_seq_length)
# The batch at max_seq_length itself: two rows, one full and one padded. One case, not two: the long rows are most
# of verification's time (quadratic attention: a 0.6B model's 3,344-token rows were 2/3 of its first export), and a
# padded row beside a full one at the full length is what they check; a lone full row (the (1, T) case this grid
# had) ran the same row again, in PyTorch and in the graph, and checked a batch of one, which the short lengths do.
FULL_LENGTH_BATCHES = (2,)
# The most memory the attention maps of one comparison take, PyTorch's and the graph's each (a run's comparison
# holds about six such copies: PyTorch's per-layer maps and their stack, the graph's, the difference, the masked
# values).
ATTENTION_BYTES = 64 * 2**20
# Long-context models (ModernBERT at 8,192 tokens, Qwen3 at 32,768) must export and serve within 24 GB. One row's
# attention maps take L x nh x T^2 x 4 bytes (ModernBERT-base at 8,192: 22 x 12 x 8192^2 x 4 = 71 GB), so the
# attention graph is verified, and served, up to the length whose maps take at most ATTENTION_MAP_BYTES a row.
ATTENTION_MAP_BYTES = 2**30
# The other graphs hold one layer's scores at a time, nh x T^2 x 4 bytes a row, a few copies alive at once (the
# scores, their softmax, the masked copy). Verification runs them, and PyTorch, in runs of rows whose scores take
# at most SCORES_BYTES, up to the length where one row's do (ModernBERT-base: 3,861 tokens; at 8,192 one row's
# scores take 3.2 GB a copy). The bound is on top of the weights, held once (PyTorch's or one session's): for
# Qwen3-0.6B (2.2 GiB of fp32 weights) the export's peak stays under 3x its weights.
SCORES_BYTES = 2 * 2**30
SCORES_COPIES = 3
VERIFIED_TEXTS = 512  # the first sample texts are verification's; int8 calibrates on the ones after them
# The texts are int8's bar (mean and p1 cosine, TOLERANCES), measured on an int8 graph's first session; the fp32 and
# fp16 graphs are held to the random cases and run the first FLOAT_TEXTS of them, real token ids as a check beside
# those, as does an int8 graph's session with other optimizers (its numbers are the same but for a fused kernel).
# A 0.6B model runs about 430 tokens a second in fp32 on 2 cores: all 512 texts (35,000 tokens) took 80 s a graph,
# a third of its export.
FLOAT_TEXTS = 64
CALIBRATION_TEXTS = 64
# The texts' batches: padded-token budget, most rows. 4096 tokens' activations (all-mpnet-base-v2's feed-forward alone
# holds 50 MB of them a layer, twice) were 0.2 GB of its export's peak, in PyTorch's reference and verification's runs.
TEXT_BATCHES = (1024, 64)
# PyTorch's reference runs the cases and texts in runs of at most this many tokens (a longer row alone): a
# 17-row case of 64 tokens took 0.16 GB more in PyTorch's freed blocks at once (export/memory.py), at the peak of
# all-mpnet-base-v2's first export. Its outputs do not turn on how rows are grouped (verify.py's tolerances).
REFERENCE_RUN_TOKENS = 256


@dataclass(frozen=True)
class Tolerance:
    metric: str
    limit: float
    higher_is_better: bool

    def holds(self, value: float) -> bool:
        return value >= self.limit if self.higher_is_better else value <= self.limit

    def describe(self, value: float) -> str:
        # A cosine bar near 1 (0.999, auto's 0.9999 for bf16) needs the digits past it to say by how much it holds.
        digits = 7 if self.higher_is_better else 3
        return f"{self.metric} {value:.{digits}g} {'>=' if self.higher_is_better else '<='} {self.limit:g}"


TOLERANCES = {
    "fp32": Tolerance("max_abs_last_hidden_state", 1e-4, higher_is_better=False),
    "fp16": Tolerance("min_cosine_sentence_embedding", 0.999, higher_is_better=True),
    "int8": Tolerance("mean_cosine_sentence_embedding_texts", 0.99, higher_is_better=True),
    # bf16 (OpenVINO on a CPU with native bf16) is listed where it holds fp16's bar, what a run that asks for half
    # precision gets (issue 33's for the Qwen3-Embedding-4B shape); --precision auto chooses it over fp32 only where
    # it also holds engine.py's AUTO_BF16 (issue 21's bar, 0.9999 on average over real texts).
    "bf16": Tolerance("min_cosine_sentence_embedding", 0.999, higher_is_better=True),
}
# The attention graph's value norms (model/value_norms.py) against PyTorch's: the largest error over the real
# tokens, relative to the largest norm (they are sums of squares of the hidden size's terms: fp32 rounding grows
# with their scale).
VALUE_NORMS_BAR = 1e-4
# The last-layer graph's rollout (export/attention_last.py, float32) against attnserve/attention_analyses.py's rollout
# (float64) of PyTorch's maps: the largest error over the real tokens. A product of L row-stochastic matrices, its
# values are at most 1; fp32's bar on the hidden states.
ROLLOUT_BAR = 1e-4


class GraphCheck(NamedTuple):
    """A graph to verify: its file, its precision (which tolerance holds it), and how its session is opened."""

    path: Path
    precision: str
    disabled_optimizers: tuple[str, ...] = ()  # onnxruntime graph transformers its session must not apply
    backend: str = ONNXRUNTIME  # engine/session.py


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)


def attention_max_length(num_layers: int, num_heads: int, max_seq_length: int) -> int:
    """The longest input whose attention maps (one row: num_layers x num_heads x T^2 float32) fit
    ATTENTION_MAP_BYTES: the attention graph is verified and served up to it. A model without attention (a static
    one: no layers) has no maps: max_seq_length."""
    if not num_layers * num_heads:
        return max_seq_length
    return min(max_seq_length, int((ATTENTION_MAP_BYTES / (num_layers * num_heads * 4)) ** 0.5))


def verified_max_length(num_heads: int, max_seq_length: int) -> int:
    """The longest input verification runs the graphs and PyTorch at: one layer's scores of one row (num_heads x
    T^2 float32, SCORES_COPIES alive) fit SCORES_BYTES. max_seq_length for every model up to a few thousand
    tokens; a model without attention (num_heads 0: a static one) has no scores."""
    if not num_heads:
        return max_seq_length
    return min(max_seq_length, int((SCORES_BYTES / (SCORES_COPIES * num_heads * 4)) ** 0.5))


def shape_grid(max_seq_length: int) -> list[tuple[int, int]]:
    """(batch, sequence length) of the check cases: every batch size at the short lengths, FULL_LENGTH_BATCHES at
    max_seq_length (module docstring). Lengths past max_seq_length are left out."""
    short = [(b, t) for b in BATCH_SIZES for t in SHORT_LENGTHS if t <= max_seq_length]
    return short + [(b, max_seq_length) for b in FULL_LENGTH_BATCHES if (b, max_seq_length) not in short]


@dataclass(frozen=True)
class LengthCaps:
    """How far a model's check inputs go and in runs of how many rows, so that verification's memory is bounded by
    the model's layers and heads, not by its max_seq_length (the module constants). Embedders' and rerankers'
    references share it."""

    num_layers: int
    num_heads: int
    verified_max_length: int  # the longest case the graphs and PyTorch run
    attention_max_length: int  # the longest case an attention graph runs (and is served up to)

    @classmethod
    def of(cls, num_layers: int, num_heads: int, max_seq_length: int) -> LengthCaps:
        verified = verified_max_length(num_heads, max_seq_length)
        return cls(num_layers, num_heads, verified, attention_max_length(num_layers, num_heads, verified))

    def grid(self) -> list[tuple[int, int]]:
        """shape_grid at verified_max_length, and the attention graph's own longest case where it is shorter."""
        grid = shape_grid(self.verified_max_length)
        if self.attention_max_length < self.verified_max_length:
            grid.append((1, self.attention_max_length))
        return grid

    def manifest_fields(self) -> dict[str, int]:
        return {"verified_max_length": self.verified_max_length, "attention_max_length": self.attention_max_length}

    def note(self, max_seq_length: int) -> str | None:
        """What the export's log says where the caps cut max_seq_length; None where they do not."""
        if self.verified_max_length < max_seq_length:
            return (f"max_seq_length {max_seq_length} is past what memory allows verifying: the graphs are verified "
                    f"up to {self.verified_max_length} tokens, and the attention graph verified and served up to "
                    f"{self.attention_max_length} (its maps take layers x heads x tokens^2 floats a row)")
        if self.attention_max_length < max_seq_length:
            return (f"attention maps are verified and served up to {self.attention_max_length} tokens "
                    "(layers x heads x tokens^2 floats a row)")
        return None

    def attention_runs(self, rows: int, seq: int) -> list[slice]:
        """The rows of a case in runs whose attention maps take at most ATTENTION_BYTES each."""
        return _runs(rows, self.num_layers * self.num_heads * seq * seq * 4, ATTENTION_BYTES)

    def score_runs(self, rows: int, seq: int, most_tokens: int | None = None) -> list[slice]:
        """The rows of a case in runs whose one layer's scores take at most SCORES_BYTES each (and, where
        most_tokens is given, of at most that many tokens but for a single row's)."""
        runs = _runs(rows, SCORES_COPIES * self.num_heads * seq * seq * 4, SCORES_BYTES)
        if most_tokens is None:
            return runs
        step = min(runs[0].stop - runs[0].start if runs else 1, max(1, most_tokens // seq))
        return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def _runs(rows: int, per_row: int, budget: int) -> list[slice]:
    step = max(1, budget // per_row) if per_row else rows  # per_row 0: no maps nor scores (a static model)
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


REFERENCE = "reference.npz"


class Reference:
    """The check inputs and PyTorch's outputs on them, against which every graph is verified.

    Made once, with the PyTorch encoder, when a directory's first graph is exported: the shape grid's cases (rows
    of random token ids, padded, with random segments where the model has token types), PyTorch's last_hidden_state
    and sentence embedding of each, and the sentence embeddings of the first `n_texts` sample texts. Saved beside
    the graphs (save(), REFERENCE) and loaded again (load()), it verifies the graphs built later from the first
    (fused, fp16, OpenVINO's) without PyTorch: the same inputs, PyTorch's own outputs on them.

    What the stored part cannot give needs the encoder: the attention maps (a 12-layer model's are 150 MB a row
    at 512 tokens: maps() computes them case by case into files, in runs of at most ATTENTION_BYTES, and
    measure_all reads them back run by run, a layer at a time), and more texts' embeddings (with_texts(): int8's
    bar and the quantized embeddings' ranges are the 512 texts').
    """

    def __init__(self, encoder: Encoder | EncoderModule | None, head: torch.nn.Module | None, embedding_size: int,
                 tokenizer: TextTokenizer, n_texts: int = FLOAT_TEXTS, seed: int = 0,
                 token_types: bool | None = None, caps: LengthCaps | None = None, _outputs: bool = True):
        """token_types: whether the graphs take token_type_ids; None: as the model has token types (False
        checks a graph exported before graphs took them)."""
        rng = np.random.default_rng(seed)
        self.encoder, self.head, self.tokenizer = encoder, head, tokenizer
        if encoder is not None:
            cfg = encoder.config
            self.token_types = cfg.has_token_types if token_types is None else token_types
            # The lengths memory allows: max_seq_length, but for long-context models.
            self.caps = LengthCaps.of(cfg.num_layers, cfg.num_heads, tokenizer.max_seq_length)
            ids_from = made_up_token_ids(cfg.vocab_size)
        else:  # load(): the cases and outputs come from the file
            assert caps is not None and token_types is not None, "a stored reference has its caps and types"
            self.token_types, self.caps = token_types, caps
        self.embedding_size = embedding_size  # D: the pipeline's sentence embedding (Dense, concatenated poolings)
        self.cases: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []  # (ids, mask, types), (B, T) each
        self.expected: list[tuple[np.ndarray, np.ndarray]] = []  # PyTorch's (hidden (B, T, H), sentence (B, D))
        self.text_sentences = np.empty((0, embedding_size), dtype=np.float32)
        self._set_texts(n_texts)
        if encoder is None or not _outputs:
            return
        for batch, seq in self.caps.grid():
            lengths = rng.integers(1, seq + 1, size=batch)
            lengths[rng.integers(batch)] = seq  # the batch really is `seq` long
            ids, mask = pad([rng.integers(ids_from.start, ids_from.stop, size=n) for n in lengths])
            self.cases.append((ids, mask, self._segments(rng, lengths, seq)))
        self.expected = [self._outputs(*case) for case in self.cases]
        self.with_texts(n_texts)

    def _set_texts(self, n_texts: int) -> None:
        texts = [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()][:n_texts]
        self.text_inputs = self.tokenizer.encode_texts(texts)
        self.text_batches = plan_batches([len(x) for x in self.text_inputs], *TEXT_BATCHES)
        # The first FLOAT_TEXTS texts' batches (their rows index the same arrays).
        self.float_text_batches = plan_batches([len(x) for x in self.text_inputs[:FLOAT_TEXTS]], *TEXT_BATCHES)

    def with_texts(self, n_texts: int) -> Reference:
        """PyTorch's sentence embeddings of the first n_texts sample texts (those it has are kept); needs the
        encoder for texts it has not. Returns self."""
        done = len(self.text_sentences)
        if done >= n_texts and len(self.text_inputs) >= n_texts:
            return self
        self._set_texts(max(n_texts, done))
        if self.encoder is None:
            raise ValueError("the embeddings of more texts need the model in PyTorch; this reference is stored")
        sentences = np.empty((len(self.text_inputs), self.embedding_size), dtype=np.float32)
        sentences[:done] = self.text_sentences
        for rows in self.text_batches:
            todo = [i for i in rows if i >= done]
            if todo:
                ids, mask = pad([self.text_inputs[i].ids for i in todo])
                rows, seq = ids.shape
                for run in self.caps.score_runs(rows, seq, REFERENCE_RUN_TOKENS):
                    sentences[todo[run]] = self.expected_outputs(ids[run], mask[run], None, attentions=False)[1]
        self.text_sentences = sentences
        return self

    def _outputs(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """PyTorch's (hidden (B, T, H), sentence (B, D)) of a case, computed in runs of rows of bounded memory."""
        assert self.encoder is not None, "PyTorch's outputs need the encoder"
        cfg = self.encoder.config
        # H: the hidden size, or a ColBERT model's vector size (model/colbert.py TokenVectors.output_size)
        width = getattr(self.encoder, "output_size", cfg.hidden_size)
        rows_in_case, seq = ids.shape
        hidden = np.zeros((rows_in_case, seq, width), dtype=np.float32)  # padded positions: compared nowhere
        sentence = np.empty((rows_in_case, self.embedding_size), dtype=np.float32)
        for rows in self.caps.score_runs(rows_in_case, seq, REFERENCE_RUN_TOKENS):
            # A run's rows cut to their longest real length (the rows are padded on the right): the real tokens'
            # outputs are the same, and a padded row of a full-length case costs its own length, not the case's.
            n = int(mask[rows].sum(axis=1).max())
            hidden[rows, :n], sentence[rows], _, _ = self.expected_outputs(
                ids[rows, :n], mask[rows, :n], None if types is None else types[rows, :n], attentions=False)
        return hidden, sentence

    def _segments(self, rng: np.random.Generator, lengths: np.ndarray, seq: int) -> np.ndarray | None:
        """Token types as sentence pairs have them (0 for segment a, 1 from where segment b starts), for a model
        that has token types; None for one that has not (its graphs take no token_type_ids)."""
        if not self.token_types:
            return None
        types = np.zeros((len(lengths), seq), dtype=np.int64)
        for row, n in enumerate(lengths):
            types[row, rng.integers(1, n + 1):n] = 1
        return types

    def feed(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> dict[str, np.ndarray]:
        feed = {"input_ids": ids, "attention_mask": mask}
        if self.token_types:  # the text checks have no types: all zeros, as the engine feeds
            feed["token_type_ids"] = np.zeros_like(ids) if types is None else types
        return feed

    def expected_outputs(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None, attentions: bool):
        """PyTorch's last_hidden_state (B, T, H), sentence embedding (B, D) and, if asked, attentions
        (L, B, nh, T, T) and value norms (L, B, nh, T) (model/value_norms.py)."""
        assert self.encoder is not None and self.head is not None, "PyTorch's outputs need the encoder"
        # Where the encoder is: a GPU's, for a model whose reference would take the CPU minutes (the 8B shape).
        device = next(cast(torch.nn.Module, self.encoder).parameters()).device
        keep_value_norms(cast(torch.nn.Module, self.encoder), attentions)
        # No maps wanted: PyTorch's fused kernel, with no (T, T) scores held (model/fused_attention.py).
        with torch.no_grad(), fused_attention(cast(torch.nn.Module, self.encoder), not attentions):
            m = torch.from_numpy(mask).to(device)
            hidden, att = self.encoder(torch.from_numpy(ids).to(device), m, attentions,
                                       None if types is None else torch.from_numpy(types).to(device))
            sentence = self.head(hidden, m)
            norms = (stacked_value_norms(cast(torch.nn.Module, self.encoder)).float().cpu().numpy() if attentions
                     else None)
        return (hidden.float().cpu().numpy(), sentence.float().cpu().numpy(),
                (att.float().cpu().numpy() if att is not None else None), norms)

    def maps(self, maps_dir: Path) -> list[tuple[Path | None, np.ndarray | None]]:
        """PyTorch's attention maps (L, B, nh, T, T) of each case up to attention_max_length, in a .npy file per
        case in maps_dir, and its value norms (L, B, nh, T); (None, None) for the longer cases."""
        if self.encoder is None:
            raise ValueError("the attention maps' verification needs the model in PyTorch; this reference is stored")
        cfg = self.encoder.config
        out: list[tuple[Path | None, np.ndarray | None]] = []
        for i, (ids, mask, types) in enumerate(self.cases):
            rows_in_case, seq = ids.shape
            if seq > self.caps.attention_max_length:
                out.append((None, None))
                continue
            maps_file = maps_dir / f"case-{i}.npy"
            stored = np.lib.format.open_memmap(  # (L, B, nh, T, T)
                maps_file, mode="w+", dtype=np.float32, shape=(cfg.num_layers, rows_in_case, cfg.num_heads, seq, seq))
            norms = np.empty((cfg.num_layers, rows_in_case, cfg.num_heads, seq), np.float32)
            for rows in self.caps.attention_runs(rows_in_case, seq):
                _, _, stored[:, rows], norms[:, rows] = self.expected_outputs(
                    ids[rows], mask[rows], None if types is None else types[rows], attentions=True)
            stored.flush()
            del stored
            out.append((maps_file, norms))
        return out

    def save(self, path: Path) -> None:
        """The cases, PyTorch's outputs on them and the texts' embeddings, in one .npz file."""
        arrays: dict[str, Any] = {
            "caps": np.array([self.caps.num_layers, self.caps.num_heads, self.caps.verified_max_length,
                              self.caps.attention_max_length], dtype=np.int64),
            "token_types": np.array(self.token_types), "text_sentences": self.text_sentences}
        for i, ((ids, mask, types), (hidden, sentence)) in enumerate(zip(self.cases, self.expected, strict=True)):
            arrays |= {f"{i}/ids": ids, f"{i}/mask": mask, f"{i}/hidden": hidden, f"{i}/sentence": sentence}
            if types is not None:
                arrays[f"{i}/types"] = types
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: Path, tokenizer: TextTokenizer, embedding_size: int, encoder: Encoder | EncoderModule | None
             = None, head: torch.nn.Module | None = None) -> Reference:
        """A reference save() wrote; with the encoder (and head) where the build needs PyTorch too."""
        with np.load(path) as saved:
            layers, heads, verified, attention = (int(x) for x in saved["caps"])
            token_types = bool(saved["token_types"])
            stored = cls(None, None, embedding_size, tokenizer, n_texts=len(saved["text_sentences"]),
                         token_types=token_types, caps=LengthCaps(layers, heads, verified, attention))
            stored.text_sentences = saved["text_sentences"]
            count = len({key.split("/")[0] for key in saved.files if "/" in key})
            for i in range(count):
                stored.cases.append((saved[f"{i}/ids"], saved[f"{i}/mask"],
                                     saved[f"{i}/types"] if f"{i}/types" in saved.files else None))
                stored.expected.append((saved[f"{i}/hidden"], saved[f"{i}/sentence"]))
        stored.encoder, stored.head = encoder, head
        return stored


def calibration_feeds(tokenizer: TextTokenizer) -> list[dict[str, np.ndarray]]:
    """Engine-style batches of the sample texts after the verified ones: {"input_ids", "attention_mask"} (B, T)."""
    texts = [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]
    inputs = tokenizer.encode_texts(texts[VERIFIED_TEXTS : VERIFIED_TEXTS + CALIBRATION_TEXTS])
    feeds = []
    for rows in plan_batches([len(x) for x in inputs], *TEXT_BATCHES):
        ids, mask = pad([inputs[i].ids for i in rows])
        feeds.append({"input_ids": ids, "attention_mask": mask})
    return feeds


class _Parity:
    """The worst errors of one graph against PyTorch, over every case it ran."""

    def __init__(self, wants_attention: bool):
        self.wants_attention = wants_attention
        self.cases = 0
        self.max_hidden = self.max_sentence = self.max_attention = self.max_padded_key_weight = 0.0
        self.max_value_norms: float | None = None  # relative to the largest norm; None: the graph gives none
        self.max_rollout: float | None = None  # None: the graph gives no rollout
        self.min_cos = 1.0

    def add(self, outputs: dict[str, np.ndarray], mask: np.ndarray, hidden: np.ndarray, sentence: np.ndarray,
            attentions: np.ndarray | _StoredMaps | None, norms: np.ndarray | None = None) -> None:
        """One run of a case's rows (the caller counts the cases): the graph's outputs by name. attentions:
        PyTorch's maps (L, B, nh, T, T); norms: its value norms (L, B, nh, T)."""
        real = mask.astype(bool)  # (B, T): compare real token positions only
        if norms is not None and "value_norms" in outputs:
            keys = real[None, :, None, :]  # (1, B, 1, T): the real tokens' norms
            worst = float(np.where(keys, np.abs(outputs["value_norms"] - norms), 0.0).max())
            self.max_value_norms = max(self.max_value_norms or 0.0, worst / max(float(np.abs(norms).max()), 1e-12))
        self.max_hidden = max(self.max_hidden, float(np.abs(outputs["last_hidden_state"] - hidden)[real].max()))
        sentences = outputs["sentence_embedding"]
        self.max_sentence = max(self.max_sentence, float(np.abs(sentences - sentence).max()))
        self.min_cos = min(self.min_cos, float(_cosine(sentences, sentence).min()))
        if attentions is None:
            return
        # Every layer's maps (the attention graph), or the last layer's alone (the last-layer graph).
        got = outputs["attentions"] if "attentions" in outputs else outputs[LAST_MAPS][None]  # (L or 1, B, nh, T, T)
        for k in range(len(got)):  # a layer at a time: the temporaries are 1/L of the maps
            self._compare_maps(got[k], attentions[k if "attentions" in outputs else -1], real)
        if ROLLOUT in outputs:
            self._compare_rollout(outputs[ROLLOUT], attentions, real)

    def _compare_maps(self, got: np.ndarray, want: np.ndarray, real: np.ndarray) -> None:
        """One layer's maps (B, nh, T, T), the graph's and PyTorch's, over the real queries and keys."""
        keys = real[:, None, None, :]  # (B, 1, 1, T): broadcast over heads and queries
        pairs = keys & real[:, None, :, None]  # (B, 1, T, T): real queries x real keys
        error = np.where(pairs, np.abs(got - want), 0.0)
        self.max_attention = max(self.max_attention, float(error.max()))
        del error
        padded = float(np.where(keys, 0.0, got).max())
        self.max_padded_key_weight = max(self.max_padded_key_weight, padded)

    def _compare_rollout(self, got: np.ndarray, attentions: np.ndarray | _StoredMaps, real: np.ndarray) -> None:
        """The graph's rollout (B, T, T) against rollout_of_means of PyTorch's maps, each row's real block."""
        means = np.stack([attentions[layer].mean(axis=1, dtype=np.float64)  # (L, B, T, T), a layer read at a time
                          for layer in range(len(attentions))])
        for row, n in enumerate(real.sum(axis=1)):
            want = rollout_of_means(means[:, row, :n, :n])  # (n, n)
            self.max_rollout = max(self.max_rollout or 0.0, float(np.abs(got[row, :n, :n] - want).max()))


def measure_all(graphs: dict[str, GraphCheck], reference: Reference, provider: str = CPU,
                on_graph: Callable[[str], None] = lambda name: None) -> dict[str, dict[str, float]]:
    """Every parity metric of each graph, as floats for the manifest.

    PyTorch's hidden states and sentence embeddings are the reference's (computed when it was made, or stored).
    Where a graph returns attention maps, PyTorch's maps are computed first (Reference.maps: the encoder runs before
    any session opens), written to files and read back run by run. Then one session is open at a time, in the order
    given, never beside PyTorch's activations. A graph with attention maps runs the cases up to the caps'
    attention_max_length only; every case runs in runs of rows of bounded memory (LengthCaps). on_graph(name) is
    told as each graph's turn comes (progress).
    """
    # The attention graph's maps, or the last-layer graph's last layer and rollout (attention_last.py).
    with_maps = {name for name, graph in graphs.items() if {"attentions", LAST_MAPS} & set(_output_names(graph.path))}
    metrics = {}
    on_all_texts: set[Path] = set()  # int8 files measured on all the texts (FLOAT_TEXTS comment)
    with tempfile.TemporaryDirectory(prefix="attnserve-verify-") as maps_dir:
        maps = reference.maps(Path(maps_dir)) if with_maps else [(None, None)] * len(reference.cases)
        release_freed_memory()
        with small_heaps():  # the sessions' runs without an arena (memory.py)
            for name, (path, precision, disabled_optimizers, backend) in graphs.items():
                on_graph(name)
                # An arena emptied after each run: kept, it would hold the session's largest run (the attention
                # maps) for the whole export; none at all, each layer's buffers were faulted in anew (engine/session.py
                # _ArenaPerRun). No prepacked copy of the weights: 0.4 GB of all-mpnet-base-v2's cold start's peak.
                session = open_graph(path, backend, precision, provider, arena="per_run",
                                     disabled_optimizers=disabled_optimizers, prepack=False, spin=CHECK_SPIN)
                if ("token_type_ids" in [i.name for i in session.get_inputs()]) != reference.token_types:
                    raise ExportVerificationError(f"{path.name} {'lacks' if reference.token_types else 'has'} "
                                                  "the input token_type_ids that the reference was made for")
                parity = _Parity(name in with_maps)
                outputs = ([o.name for o in session.get_outputs()] if parity.wants_attention
                           else ["last_hidden_state", "sentence_embedding"])
                for (ids, mask, types), (hidden, sentence), (maps_file, norms) in zip(
                        reference.cases, reference.expected, maps, strict=True):
                    if parity.wants_attention and ids.shape[1] > reference.caps.attention_max_length:
                        continue
                    runs = reference.caps.attention_runs if parity.wants_attention else reference.caps.score_runs
                    for rows in runs(*ids.shape):
                        got = dict(zip(outputs, session.run(outputs, reference.feed(
                            ids[rows], mask[rows], None if types is None else types[rows])), strict=True))
                        want = _StoredMaps(maps_file, rows) if parity.wants_attention else None
                        parity.add(got, mask[rows], hidden[rows], sentence[rows], want,
                                   norms[:, rows] if parity.wants_attention and norms is not None else None)
                        del got, want
                    parity.cases += 1
                all_texts = precision == "int8" and path not in on_all_texts
                if all_texts:
                    on_all_texts.add(path)
                metrics[name] = _metrics(parity, session, reference, all_texts)
                del session
    return metrics


def _output_names(path: Path) -> list[str]:
    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


class _StoredMaps:
    """PyTorch's attention maps of a run's rows, (L, B, nh, T, T), read from the case's file a layer at a time as
    _Parity.add indexes them. Read whole, a long-context run's (a GiB a Qwen3-0.6B row at 774 tokens) sat beside
    the graph's own and was the export's peak."""

    def __init__(self, maps_file: Path | None, rows: slice):
        assert maps_file is not None, "the maps of every case up to attention_max_length are written"
        self.maps_file, self.rows = maps_file, rows

    def __len__(self) -> int:
        """L, the layers."""
        stored = np.load(self.maps_file, mmap_mode="r")
        layers = len(stored)
        del stored
        return layers

    def __getitem__(self, layer: int) -> np.ndarray:
        """(B, nh, T, T), in memory, the file unmapped again."""
        stored = np.load(self.maps_file, mmap_mode="r")
        maps = np.array(stored[layer, self.rows])
        del stored
        return maps


def _metrics(parity: _Parity, session, reference: Reference, all_texts: bool) -> dict[str, float]:
    """The metrics of the cases run, and the cosine on the texts: all of them (int8's bar), or the first
    FLOAT_TEXTS."""
    batches = reference.text_batches if all_texts else reference.float_text_batches
    checked = sum(len(batch) for batch in batches)
    text_cos = np.empty(len(reference.text_inputs), dtype=np.float32)
    for batch in batches:
        ids, mask = pad([reference.text_inputs[i].ids for i in batch])
        got = session.run(["sentence_embedding"], reference.feed(ids, mask, None))[0]
        text_cos[batch] = _cosine(got, reference.text_sentences[batch])
    text_cos = text_cos[:checked]  # the batches hold the first `checked` texts
    metrics = {
        "max_abs_last_hidden_state": parity.max_hidden,
        "max_abs_sentence_embedding": parity.max_sentence,
        "min_cosine_sentence_embedding": parity.min_cos,
        "mean_cosine_sentence_embedding_texts": float(text_cos.mean()),
        "p1_cosine_sentence_embedding_texts": float(np.percentile(text_cos, 1)),
        "min_cosine_sentence_embedding_texts": float(text_cos.min()),
        "shapes_checked": parity.cases,
        "texts_checked": checked,
    }
    if parity.wants_attention:
        metrics["max_abs_attentions"] = parity.max_attention
        metrics["max_padded_key_weight"] = parity.max_padded_key_weight
        if parity.max_value_norms is not None:
            metrics["max_rel_value_norms"] = parity.max_value_norms
        if parity.max_rollout is not None:
            metrics["max_abs_rollout"] = parity.max_rollout
    return metrics


def measure(path: Path, precision: str, reference: Reference, provider: str = CPU) -> dict[str, float]:
    """Every parity metric of one graph."""
    return measure_all({path.name: GraphCheck(path, precision)}, reference, provider)[path.name]


def check(path: Path, precision: str, metrics: dict[str, float]) -> None:
    """Fail the export with a clear message if the variant's tolerance does not hold."""
    tolerance = TOLERANCES[precision]
    value = metrics[tolerance.metric]
    norms = metrics.get("max_rel_value_norms")
    if norms is not None and not norms <= VALUE_NORMS_BAR:
        raise ExportVerificationError(f"{path.name} ({precision}) fails parity with PyTorch: its value norms are "
                                      f"{norms:g} of the largest off, over {VALUE_NORMS_BAR:g}")
    rollout = metrics.get("max_abs_rollout")
    if rollout is not None and not rollout <= ROLLOUT_BAR:
        raise ExportVerificationError(f"{path.name} ({precision}) fails parity with PyTorch: its rollout is "
                                      f"{rollout:g} off, over {ROLLOUT_BAR:g}")
    if not tolerance.holds(value) or ("max_padded_key_weight" in metrics and metrics["max_padded_key_weight"] != 0):
        raise ExportVerificationError(
            f"{path.name} ({precision}) fails parity with PyTorch: {tolerance.describe(value)} does not hold"
            + (f"; padded keys got weight {metrics['max_padded_key_weight']:g}"
               if metrics.get("max_padded_key_weight") else ""))


def verify(path: Path, precision: str, reference: Reference, provider: str = CPU) -> dict[str, float]:
    """measure(), then check()."""
    metrics = measure(path, precision, reference, provider)
    check(path, precision, metrics)
    return metrics
