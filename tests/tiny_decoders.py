"""Tiny Llama, Mistral and Qwen2 checkpoints saved by transformers itself (LlamaModel, MistralModel, Qwen2Model and
their ForCausalLM), each with a tokenizer of its published embedders' kind, and their sentence-transformers folders:
- llama: Llama 3's byte-level BPE, "<|begin_of_text|> $A <|end_of_text|>" around a text; Llama 3's scaled rotary
  positions (rope_type "llama3", its three regimes all within the head size) and biases on attention (its option);
  mean pooling;
- mistral: e5-mistral-7b-instruct's kind, "<s> $A </s>" around a text, its instruction prompt, last-token pooling,
  and a sliding window short enough to bite within the rows the suite draws;
- qwen2: gte-Qwen2's kind, Qwen's byte-level BPE appending "<|endoftext|>" (tiny_qwen3.py), last-token pooling.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from .checkpoints import save_fast_tokenizer, save_model, save_sentence_transformer
from .tiny_eurobert import BOS as LLAMA_BOS
from .tiny_eurobert import EOS as LLAMA_EOS
from .tiny_qwen3 import END_OF_TEXT, qwen3_tokenizer
from .tiny_tokenizers import bracketed, byte_level_bpe

SIZES = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             intermediate_size=96, max_position_embeddings=128)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 1000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
MISTRAL_WINDOW = 24  # shorter than the longest rows the conformance suite draws (100 tokens)
# e5-mistral-7b-instruct's prompt form (its README): an instruction, then the query.
MISTRAL_PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
                            "Query: ", "document": ""}


def _tokenizer(directory: Path, family: str) -> tuple[Tokenizer, str, str]:
    """The family's tokenizer.json, written into directory: (tokenizer, first special, end-of-text)."""
    out = directory / "tokenizer.json"
    if family == "qwen2":
        return Tokenizer.from_file(str(qwen3_tokenizer(out))), END_OF_TEXT, END_OF_TEXT
    first, last = (LLAMA_BOS, LLAMA_EOS) if family == "llama" else ("<s>", "</s>")
    return Tokenizer.from_file(str(bracketed(byte_level_bpe([first, last]), first, last, out))), first, last


def save_tiny_decoder(directory: Path, family: str, model_class: str | None = None, seed: int = 0, **config) -> Path:
    """A 3-layer, hidden-64 decoder of `family` (llama, mistral or qwen2): 4 query heads of head_dim 32 sharing 2
    key/value heads, 128 positions, wide random weights (save_model); config: the config class's settings over
    these and the family's own above."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer, first, last = _tokenizer(directory, family)
    ids = {t: tokenizer.token_to_id(t) for t in (first, last)}
    own = {"llama": {"rope_parameters": LLAMA3_ROPE, "attention_bias": True},
           "mistral": {"sliding_window": MISTRAL_WINDOW, "rope_theta": 1000.0},
           "qwen2": {"rope_theta": 1000.0}}[family]
    classes = {"llama": ("LlamaConfig", "LlamaModel"), "mistral": ("MistralConfig", "MistralModel"),
               "qwen2": ("Qwen2Config", "Qwen2Model")}[family]
    settings = dict(vocab_size=tokenizer.get_vocab_size(), rms_norm_eps=1e-6, pad_token_id=ids[last],
                    bos_token_id=ids[first], eos_token_id=ids[last], **SIZES, **own)
    model_config = getattr(transformers, classes[0])(**{**settings, **config})
    save_model(directory, model_config, model_class or classes[1], seed)
    save_fast_tokenizer(directory, directory / "tokenizer.json", bos_token=first, eos_token=last, pad_token=last,
                        padding_side="left", model_max_length=model_config.max_position_embeddings)
    return directory


def save_decoder_embedder(model_dir: Path, directory: Path, family: str, max_seq_length: int) -> Path:
    """sentence-transformers' own save of the family's embedder pipeline over `model_dir`."""
    if family == "llama":
        return save_sentence_transformer(model_dir, directory, "mean", True, max_seq_length)
    prompts = MISTRAL_PROMPTS if family == "mistral" else None
    return save_sentence_transformer(model_dir, directory, "lasttoken", True, max_seq_length,
                                     **({"prompts": prompts} if prompts else {}))
