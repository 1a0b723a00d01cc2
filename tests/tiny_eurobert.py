"""A tiny EuroBERT, saved by transformers' own classes (EuroBertModel, EuroBertForMaskedLM) with random weights, and
a tokenizer of EuroBERT's kind: Llama 3's byte-level BPE with "<|begin_of_text|> $A <|end_of_text|>" around a text,
and <|end_of_text|> doubling as the padding token."""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken

from .checkpoints import save_fast_tokenizer, save_model
from .tiny_tokenizers import bracketed, byte_level_bpe

BOS, EOS, MASK = "<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"


def eurobert_style(out: Path) -> Path:
    """Byte-level BPE (no prefix space, as Llama 3's), the specials first, <|mask|> taking the space before it."""
    return bracketed(byte_level_bpe([BOS, EOS, AddedToken(MASK, lstrip=True, special=True)]), BOS, EOS, out)


def save_tiny_eurobert(directory: Path, model_class: str = "EuroBertModel", seed: int = 0, **config) -> Path:
    """A 4-layer, hidden-64 EuroBERT: 4 query heads of size 32 (head_dim given, not hidden / heads) sharing 2
    key/value heads, rope base 1000, wide random weights (save_model). config: EuroBertConfig settings over these."""
    import transformers
    from tokenizers import Tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(eurobert_style(directory / "tokenizer.json")))
    ids = {t: tokenizer.token_to_id(t) for t in (BOS, EOS, MASK)}
    settings = dict(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, intermediate_size=96, max_position_embeddings=128,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, pad_token_id=ids[EOS],
                    bos_token_id=ids[BOS], eos_token_id=ids[EOS], mask_token_id=ids[MASK])
    config = transformers.EuroBertConfig(**{**settings, **config})
    save_model(directory, config, model_class, seed)
    save_fast_tokenizer(directory, directory / "tokenizer.json", bos_token=BOS, eos_token=EOS, pad_token=EOS,
                        mask_token=MASK, model_max_length=config.max_position_embeddings)
    return directory
