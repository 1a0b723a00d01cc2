"""Tiny Qwen3 checkpoints saved by transformers itself (Qwen3Model, Qwen3ForCausalLM), with a byte-level BPE
tokenizer built the way Qwen3's tokenizer.json is: NFC, Qwen's split regex then byte-level, "<|endoftext|>" as
padding, the chat markers as special tokens, and "yes" and "no" as whole tokens (the reranker's answers).

The embedder's tokenizer appends "<|endoftext|>" to every text (Qwen3-Embedding's post-processor
"$A <|endoftext|>") and pads on the left (its tokenizer_config.json); the reranker's adds nothing, as
Qwen3-Reranker's does not."""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from .checkpoints import save_fast_tokenizer, save_model, save_sentence_transformer
from .tiny_tokenizers import corpus

# Qwen2/Qwen3's pre-tokenizer pattern (their tokenizer.json's Split).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
END_OF_TEXT = "<|endoftext|>"
SPECIALS = [END_OF_TEXT, "<|im_start|>", "<|im_end|>"]
THINK = [AddedToken("<think>", special=False), AddedToken("</think>", special=False)]
# The model card's prompts (Qwen3-Embedding's config_sentence_transformers.json).
PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
           "document": ""}


def qwen3_tokenizer(out: Path, append_end_of_text: bool = True) -> Path:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    # "yes" and "no" as often as the answer words of a real corpus, so that each is one token, and the reranker's
    # template, so that it takes tens of tokens rather than hundreds.
    from attnserve.model.llm_reranker import PREFIX, SUFFIX

    words = ["yes", "no"] * 50 + [PREFIX, SUFFIX, PROMPTS["query"]] * 20
    tokenizer.train_from_iterator(corpus() + words, trainers.BpeTrainer(
        vocab_size=1500, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer.add_tokens(THINK)
    if append_end_of_text:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {END_OF_TEXT}", pair=f"$A {END_OF_TEXT} $B:1 {END_OF_TEXT}:1",
            special_tokens=[(END_OF_TEXT, tokenizer.token_to_id(END_OF_TEXT))])
    assert tokenizer.token_to_id("yes") is not None and tokenizer.token_to_id("no") is not None
    tokenizer.save(str(out))
    return out


def save_tiny_qwen3(directory: Path, model_class: str = "Qwen3Model", seed: int = 0, **config) -> Path:
    """A 3-layer, hidden-64 Qwen3 with 4 query heads and 2 key/value heads of head_dim 32 (not 64 / 4), 128
    positions, wide random weights (save_model), and the tokenizer above; config: Qwen3Config settings over these."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    reranker = model_class == "Qwen3ForCausalLM"
    tokenizer = Tokenizer.from_file(str(qwen3_tokenizer(directory / "tokenizer.json", not reranker)))
    pad = tokenizer.token_to_id(END_OF_TEXT)
    settings = dict(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=96,
                    max_position_embeddings=128, rope_theta=1000.0, rms_norm_eps=1e-6, pad_token_id=pad,
                    bos_token_id=pad, eos_token_id=pad, tie_word_embeddings=reranker)
    qwen_config = transformers.Qwen3Config(**{**settings, **config})
    save_model(directory, qwen_config, model_class, seed)
    save_fast_tokenizer(directory, directory / "tokenizer.json", pad_token=END_OF_TEXT, eos_token=END_OF_TEXT,
                        padding_side="left", model_max_length=qwen_config.max_position_embeddings)
    return directory


def save_qwen3_embedding(model_dir: Path, directory: Path, max_seq_length: int | None = None) -> Path:
    """sentence-transformers' own save of Qwen3-Embedding's pipeline over `model_dir`: Transformer ->
    Pooling(lasttoken) -> Normalize, with the model card's prompts."""
    return save_sentence_transformer(model_dir, directory, "lasttoken", True, max_seq_length, prompts=PROMPTS)
