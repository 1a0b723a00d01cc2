"""A tiny DeBERTa-v3, saved by transformers' own classes (DebertaV2Model, DebertaV2ForMaskedLM,
DebertaV2ForSequenceClassification) with random weights: v3's settings (relative attention with c2p and p2c over
logarithmic position buckets, position vectors from the layers' own projections, the relative table LayerNorm-ed, no
absolute positions, no token types) at a size where the buckets bite (16 buckets: distances past 8 share them) and a
lowercasing WordPiece tokenizer ([CLS] $A [SEP], as DeBERTa-v3's template)."""

from __future__ import annotations

from pathlib import Path

from .checkpoints import save_model, save_wordpiece_tokenizer

VOCAB = 200


def save_tiny_deberta(directory: Path, model_class: str = "DebertaV2Model", seed: int = 0, **config) -> Path:
    """3 layers, hidden 64, 4 heads, 128 positions, 16 position buckets reaching 64; config: DebertaV2Config settings
    over these."""
    import transformers

    save_wordpiece_tokenizer(directory, VOCAB, model_max_length=128)
    settings = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                    intermediate_size=96, max_position_embeddings=128, relative_attention=True,
                    pos_att_type=["p2c", "c2p"], position_buckets=16, max_relative_positions=64, share_att_key=True,
                    norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7,
                    pad_token_id=0)
    save_model(directory, transformers.DebertaV2Config(**{**settings, **config}), model_class, seed)
    return directory
