"""A tiny EmbeddingGemma, saved by the libraries' own classes: transformers' Gemma3TextModel with random weights and
a Gemma-style tokenizer, and sentence-transformers' EmbeddingGemma pipeline over it (mean pooling, two Dense
layers without bias or activation, Normalize, and the model card's task prompts); a tiny Gemma 2
(bge-multilingual-gemma2's kind) and a tiny Gemma (v1: bge-reranker-v2-gemma's)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

from .checkpoints import save_fast_tokenizer, save_model, save_pipeline
from .tiny_tokenizers import bracketed, corpus

# Gemma's special tokens, with their ids: <pad> 0, <eos> 1, <bos> 2, <unk> 3.
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
# EmbeddingGemma's prompts (its config_sentence_transformers.json has more tasks, of the same two forms).
PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: ",
           "Classification": "task: classification | query: ", "STS": "task: sentence similarity | query: "}


def gemma_style(out: Path, eos: bool = True) -> Path:
    """SentencePiece-style BPE as Gemma's tokenizer.json has it: spaces become "▁" in the normalizer (no
    pre-tokenizer, so pieces may span words), unknown characters fall back to bytes, "<bos> $A <eos>" around a text
    (EmbeddingGemma's tokenizer adds both; Gemma's, without eos, "<bos> $A")."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tokenizer.train_from_iterator([text.replace(" ", "▁") for text in corpus()], trainers.BpeTrainer(
        vocab_size=700, special_tokens=GEMMA_SPECIALS + bytes_, max_token_length=8, show_progress=False))
    if eos:
        return bracketed(tokenizer, "<bos>", "<eos>", out)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B:1", special_tokens=[("<bos>", tokenizer.token_to_id("<bos>"))])
    tokenizer.save(str(out))
    return out


def save_tiny_gemma3(directory: Path, seed: int = 0, **config) -> Path:
    """A 4-layer, hidden-64 Gemma 3 text model: 4 query heads of size 32 sharing 2 key/value heads, layers 0, 2 and 3
    sliding with a window of 8 (4 keys either side when bidirectional, so that the window matters from 6 tokens on),
    layer 1 full, rotary bases 1000 (full) and 100 (sliding), query_pre_attn_scalar 24 (not head_dim: the scale
    shows). Wide random weights (save_model; Gemma's norm weights are offsets from 1: a spread around 0).
    config: Gemma3TextConfig settings over these."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = Tokenizer.from_file(str(gemma_style(directory / "tokenizer.json"))).get_vocab_size()
    settings = dict(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, intermediate_size=96, max_position_embeddings=128,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        sliding_window=8, use_bidirectional_attention=True, query_pre_attn_scalar=24,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
        pad_token_id=0, eos_token_id=1, bos_token_id=2, architectures=["Gemma3TextModel"])
    config = transformers.Gemma3TextConfig(**{**settings, **config})
    save_model(directory, config, "Gemma3TextModel", seed, offset=0.0)
    save_fast_tokenizer(directory, directory / "tokenizer.json", bos_token="<bos>", eos_token="<eos>",
                        unk_token="<unk>", pad_token="<pad>", model_max_length=config.max_position_embeddings)
    return directory


def save_embedding_gemma(model_dir: Path, directory: Path, max_seq_length: int | None = None) -> Path:
    """sentence-transformers' own save of EmbeddingGemma's pipeline over `model_dir`: Transformer -> Pooling(mean)
    -> Dense(H -> 2H, no bias, Identity) -> Dense(2H -> H, no bias, Identity) -> Normalize, with its prompts.
    (The real one goes 768 -> 3072 -> 768.)"""
    import torch
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling

    def modules(H: int) -> list:
        torch.manual_seed(1)
        return [Pooling(H, "mean"), Dense(H, 2 * H, bias=False, activation_function=torch.nn.Identity()),
                Dense(2 * H, H, bias=False, activation_function=torch.nn.Identity()), Normalize()]
    return save_pipeline(model_dir, directory, modules, max_seq_length, prompts=PROMPTS)


# bge-multilingual-gemma2's query instruction form (its model card).
GEMMA2_PROMPTS = {"query": "<instruct>Given a web search query, retrieve relevant passages that answer the query.\n"
                           "<query>", "document": ""}


def save_tiny_gemma2(directory: Path, model_class: str = "Gemma2Model", seed: int = 0, **config) -> Path:
    """A 4-layer, hidden-64 Gemma 2 (bge-multilingual-gemma2's kind): 4 query heads of size 32 sharing 2 key/value
    heads, layers 0 and 2 sliding with a window of 8, 1 and 3 full (transformers' default order), rope base 1000,
    query_pre_attn_scalar 24, and attention scores soft-capped at 2 (50 in the real one: with these wide random
    weights a cap of 2 bites). config: Gemma2Config settings over these."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = Tokenizer.from_file(str(gemma_style(directory / "tokenizer.json"))).get_vocab_size()
    settings = dict(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=96, max_position_embeddings=128, sliding_window=8, query_pre_attn_scalar=24,
        attn_logit_softcapping=2.0, rope_theta=1000.0, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    config = transformers.Gemma2Config(**{**settings, **config})
    save_model(directory, config, model_class, seed, offset=0.0)
    save_fast_tokenizer(directory, directory / "tokenizer.json", bos_token="<bos>", eos_token="<eos>",
                        unk_token="<unk>", pad_token="<pad>", model_max_length=config.max_position_embeddings)
    return directory


def save_bge_gemma2(model_dir: Path, directory: Path, max_seq_length: int | None = None) -> Path:
    """sentence-transformers' own save of bge-multilingual-gemma2's pipeline over `model_dir`: Transformer ->
    Pooling(lasttoken) -> Normalize, with its query instruction as a prompt."""
    from .checkpoints import save_sentence_transformer

    return save_sentence_transformer(model_dir, directory, "lasttoken", True, max_seq_length, prompts=GEMMA2_PROMPTS)


def save_tiny_gemma(directory: Path, model_class: str = "GemmaModel", seed: int = 0, **config) -> Path:
    """A 3-layer, hidden-64 Gemma (v1), bge-reranker-v2-gemma's shape (Gemma 2B's: multi-query attention, head_dim
    above hidden / heads, GeGLU, tied embeddings) tiny: 4 query heads of size 32 sharing 1 key/value head, rope base
    1000. config: GemmaConfig settings over these."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = Tokenizer.from_file(str(gemma_style(directory / "tokenizer.json", eos=False))).get_vocab_size()
    settings = dict(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, intermediate_size=96, max_position_embeddings=128, rope_theta=1000.0, pad_token_id=0,
        eos_token_id=1, bos_token_id=2)
    config = transformers.GemmaConfig(**{**settings, **config})
    save_model(directory, config, model_class, seed, offset=0.0)
    save_fast_tokenizer(directory, directory / "tokenizer.json", bos_token="<bos>", eos_token="<eos>",
                        unk_token="<unk>", pad_token="<pad>", model_max_length=config.max_position_embeddings)
    return directory
