"""The engine's tokenizer (tokenizer.json) against the one sentence-transformers builds for the checkpoint.

sentence-transformers tokenizes with transformers' AutoTokenizer, which does not always use
tokenizer.json as it is: a BertTokenizer, for one, rebuilds its normalizer from tokenizer_config.json
(do_lower_case, strip_accents, tokenize_chinese_chars) and keeps only the vocabulary. A checkpoint
whose two files disagree would be served with other tokens than sentence-transformers uses, so the
export compares them on real and awkward texts first, and refuses on the first difference.
"""

from __future__ import annotations

from attnserve.engine.tokenizer import TextTokenizer
from attnserve.errors import CheckpointError
from attnserve.model.checkpoint import Checkpoint
from attnserve.model.rotary import RotaryPositions

from .optimize import quiet
from .verify import SAMPLE_TEXTS

# Texts that tell tokenizer settings apart: case, accents, CJK, control characters, a word over
# WordPiece's 100-character limit, and one far past any max_seq_length (truncation).
PROBES = [
    "Hello WORLD, HOW Are You?",
    "Ünïcödé: naïve café, façade, Straße, smørrebrød, İstanbul, ΣΊΣΥΦΟΣ — and “quotes”.",
    "東京は日本の首都です。北京是中国的首都。한국어 문장도 있습니다.",
    "tab\tnew\nline\r\x00nul\x07bell\u200bzero-width\u00a0nbsp",
    "a" * 120 + " " + "Supercalifragilisticexpialidocious" * 4,
    " ".join(f"Word{i} and MORE text" for i in range(600)),
]


def _reference(ckpt: Checkpoint):
    from transformers import AutoTokenizer

    try:
        with quiet():
            # No remote code: a config.json with an auto_map (GTE v1.5's "new") would otherwise have transformers
            # ask on the terminal whether to run it; without, it reads the tokenizer from tokenizer_config.json.
            return AutoTokenizer.from_pretrained(str(ckpt.directory), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # transformers raises many types here; each means the same to the user
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(f"{ckpt.directory}: transformers cannot load the checkpoint's tokenizer: "
                              f"{type(e).__name__}: {first_line}") from None


# Pooling modes whose sentence-transformers output is the same on a left-padded batch: they read the real tokens
# alone, wherever they sit (lasttoken finds the last real one on either side).
SIDE_FREE_POOLING = {"mean", "max", "mean_sqrt_len_tokens", "lasttoken"}


def _padding_side_free(ckpt: Checkpoint) -> bool:
    """A plain embedder with rotary positions (a shift of every position changes no score) and pooling that reads
    no fixed position: llama-nemotron-embed's bidirectional Llama, say."""
    return (isinstance(ckpt.config, RotaryPositions) and ckpt.kind == "embedder" and bool(ckpt.pipeline.pooling)
            and set(ckpt.pipeline.pooling) <= SIDE_FREE_POOLING)


def check_tokenizer(ckpt: Checkpoint) -> None:
    """Refuse unless tokenizer.json, truncated at max_seq_length, gives exactly sentence-transformers' token ids."""
    reference = _reference(ckpt)
    name = type(reference).__name__
    if ckpt.max_seq_length_from == "tokenizer":
        # sentence-transformers caps the tokenizer's model_max_length at the model's positions.
        theirs = min(reference.model_max_length, ckpt.config.max_position_embeddings)
        if theirs != ckpt.max_seq_length:
            raise CheckpointError(f"{ckpt.directory}: cannot reproduce the tokenizer's length: transformers' "
                                  f"{name} truncates at {theirs}, the export read {ckpt.max_seq_length}")
    for side in ("padding_side", "truncation_side"):
        # A causal model's real outputs (and its last real token) do not depend on which side is padded, nor do a
        # rotary model's, whose scores see only distances, where the pooling reads no fixed position (not cls); a
        # model whose texts are padded to a fixed length (SigLIP's, SigLIP 2's) is padded on the right, the pads
        # attended, as it was trained (model/clip.py), whichever side transformers' tokenizer class pads by default.
        if side == "padding_side" and (getattr(ckpt.config, "causal", False) or ckpt.pipeline.pad_to
                                       or _padding_side_free(ckpt)):
            continue
        if getattr(reference, side, "right") != "right":
            raise CheckpointError(f"{ckpt.directory}: cannot reproduce {side} {getattr(reference, side)!r} "
                                  "of the checkpoint's tokenizer (the engine pads and truncates on the right)")
    texts = PROBES + [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]
    ours = TextTokenizer(ckpt.tokenizer_file, ckpt.max_seq_length, ckpt.config.vocab_size).encode_texts(texts)
    with quiet():
        expected = reference(texts, truncation="longest_first", max_length=ckpt.max_seq_length)["input_ids"]
    for text, got, want in zip(texts, ours, expected, strict=True):
        got, want = got.ids.tolist(), list(want)
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
            raise CheckpointError(
                f"{ckpt.tokenizer_file}: cannot reproduce the tokenizer sentence-transformers uses: on {text[:40]!r}, "
                f"from token {at} tokenizer.json gives {got[at:at + 6]}, transformers' {name} {want[at:at + 6]}")
