"""Random-weight checkpoints of the real sizes of today's leading embedders, made with transformers' own classes
and saved by sentence-transformers with the model cards' pipelines, for the benchmarks (no weights are downloaded).

  qwen3-embedding-0.6b  Qwen3Model as Qwen3-Embedding-0.6B: 28 layers, hidden 1024, 16 query and 8 key/value heads
                        of 128, SwiGLU 3072, vocabulary 151,669; lasttoken pooling, Normalize, its query prompt.
  qwen3-embedding-4b    Qwen3-Embedding-4B's shape: 36 layers, hidden 2560, 32 query and 8 key/value heads, SwiGLU
                        9728, in bf16 (8 GB; save_qwen3_large). qwen3-embedding-8b: hidden 4096, SwiGLU 12,288 (15 GB).
  e5-mistral-7b         MistralModel as intfloat/e5-mistral-7b-instruct: 32 layers, hidden 4096, 32 query and 8
                        key/value heads, SwiGLU 14,336, vocabulary 32,000, sliding window 4096; lasttoken pooling,
                        Normalize, its web-search query prompt; in bf16 (14 GB).
  embeddinggemma-300m   Gemma3TextModel as EmbeddingGemma-300M: 24 layers, hidden 768, 3 query heads and 1
                        key/value head of 256, GeGLU 1152, vocabulary 262,144, bidirectional attention, sliding
                        window 512 with every sixth layer global; mean pooling, Dense 768->3072->768, Normalize.

The weights are transformers' initialisation (seeded), which is what the speed and the int8 accuracy are measured
on: real weights would have their own outliers. The tokenizer is a byte-level BPE of 16,000 pieces trained on the
committed sample texts (the real ones are not reachable here); both sides of a comparison use the same one.

    python bench/real_size_checkpoints.py qwen3-embedding-0.6b /tmp/qwen3-0.6b
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

SAMPLE_TEXTS = Path(__file__).resolve().parent.parent / "export/data/sample_texts.txt"
TOKENIZER_PIECES = 16_000

QWEN3_QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: ",
                 "Retrieval": "task: search result | query: ", "Clustering": "task: clustering | query: ",
                 "Classification": "task: classification | query: ", "STS": "task: sentence similarity | query: "}


def byte_level_tokenizer(specials: list[str], eos: str | None):
    """A byte-level BPE (as Qwen3's and Gemma's vocabularies are byte-level) with `eos` appended to every text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    texts = [t for t in SAMPLE_TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=TOKENIZER_PIECES, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    if eos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"$A {eos}", pair=f"$A {eos} $B:1 {eos}:1", special_tokens=[(eos, tokenizer.token_to_id(eos))])
    return tokenizer


def save_qwen3(directory: Path, seed: int = 0) -> Path:
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    tokenizer = byte_level_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>")
    pad = tokenizer.token_to_id("<|endoftext|>")
    config = transformers.Qwen3Config(
        vocab_size=151_669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, max_position_embeddings=32_768, rope_theta=1_000_000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=pad, eos_token_id=pad, bos_token_id=pad)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<|endoftext|>",
                                                eos_token="<|endoftext|>", padding_side="left")
    return _save(directory, seed, lambda: transformers.Qwen3Model(config), fast, lambda t: [
        t, Pooling(t.get_embedding_dimension(), "lasttoken"), Normalize()],
        prompts={"query": QWEN3_QUERY_PROMPT, "document": ""}, torch=torch,
        SentenceTransformer=SentenceTransformer, Transformer=Transformer, max_seq_length=32_768)


def save_embeddinggemma(directory: Path, seed: int = 0) -> Path:
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    tokenizer = byte_level_tokenizer(["<pad>", "<eos>", "<bos>", "<unk>"], "<eos>")
    ids = {t: tokenizer.token_to_id(t) for t in ("<pad>", "<eos>", "<bos>")}
    layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(24)]
    config = transformers.Gemma3TextConfig(
        vocab_size=262_144, hidden_size=768, num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1,
        head_dim=256, intermediate_size=1152, max_position_embeddings=2048, sliding_window=512,
        layer_types=layer_types, query_pre_attn_scalar=256, rms_norm_eps=1e-6, use_bidirectional_attention=True,
        hidden_activation="gelu_pytorch_tanh", pad_token_id=ids["<pad>"], eos_token_id=ids["<eos>"],
        bos_token_id=ids["<bos>"])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                                bos_token="<bos>", padding_side="right")
    return _save(directory, seed, lambda: transformers.Gemma3TextModel(config), fast, lambda t: [
        t, Pooling(t.get_embedding_dimension(), "mean"),
        Dense(768, 3072, bias=False, activation_function=torch.nn.Identity()),
        Dense(3072, 768, bias=False, activation_function=torch.nn.Identity()), Normalize()],
        prompts=GEMMA_PROMPTS, torch=torch, SentenceTransformer=SentenceTransformer, Transformer=Transformer,
        max_seq_length=2048)


def _save(directory: Path, seed: int, model, tokenizer, modules, prompts, torch, SentenceTransformer, Transformer,
          max_seq_length: int) -> Path:
    """The transformers model and tokenizer saved, then sentence-transformers' pipeline over them saved in place."""
    staging = directory.parent / f"{directory.name}.hf"
    shutil.rmtree(staging, ignore_errors=True)
    torch.manual_seed(seed)
    model().save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    transformer = Transformer(str(staging), max_seq_length=max_seq_length)
    SentenceTransformer(modules=modules(transformer), device="cpu", prompts=prompts).save(str(directory))
    shutil.rmtree(staging)
    return directory


# Qwen3-Embedding-4B and -8B as their config.json has them (bf16 weights, as published).
QWEN3_LARGE = {
    "4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=9728, max_position_embeddings=40_960),
    "8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=12_288, max_position_embeddings=40_960),
}


def save_qwen3_large(directory: Path, size: str, seed: int = 0) -> Path:
    """Qwen3-Embedding-4B or -8B's shape, its weights made in bf16 (on the GPU where there is one) and saved by
    transformers in 5 GB shards, as published; sentence-transformers' module files written as the model card's
    folder has them (lasttoken pooling, Normalize, the query prompt). Loading it into sentence-transformers to save
    would hold a second copy: 16 GB more for the 8B."""
    import transformers

    tokenizer = byte_level_tokenizer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>")
    pad = tokenizer.token_to_id("<|endoftext|>")
    config = transformers.Qwen3Config(
        vocab_size=151_665, head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        pad_token_id=pad, eos_token_id=pad, bos_token_id=pad, **QWEN3_LARGE[size])
    return _save_large_decoder(directory, transformers.Qwen3Model, config, tokenizer, "<|endoftext|>", 32_768,
                               {"query": QWEN3_QUERY_PROMPT, "document": ""}, seed)


E5_MISTRAL_QUERY_PROMPT = ("Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
                           "Query: ")


def save_e5_mistral(directory: Path, seed: int = 0) -> Path:
    """intfloat/e5-mistral-7b-instruct's shape (its config.json), weights made in bf16 and saved in 5 GB shards, its
    sentence-transformers folder as published (lasttoken pooling, Normalize, 4096 tokens, its query prompts)."""
    import transformers

    tokenizer = byte_level_tokenizer(["<unk>", "<s>", "</s>"], "</s>")
    eos = tokenizer.token_to_id("</s>")
    config = transformers.MistralConfig(
        vocab_size=32_000, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32_768, rope_theta=10_000.0, sliding_window=4096,
        rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=eos, eos_token_id=eos, bos_token_id=1)
    return _save_large_decoder(directory, transformers.MistralModel, config, tokenizer, "</s>", 4096,
                               {"web_search_query": E5_MISTRAL_QUERY_PROMPT}, seed)


def _save_large_decoder(directory: Path, model_class, config, tokenizer, pad: str, max_seq_length: int,
                        prompts: dict[str, str], seed: int) -> Path:
    """A decoder embedder's weights made in bf16 (on the GPU where there is one) and saved by transformers in 5 GB
    shards, its tokenizer padding on the left, and sentence-transformers' module files: lasttoken pooling,
    Normalize, the prompts."""
    import json

    import torch
    import transformers

    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = model_class._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory, max_shard_size="5GB")
    del model
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=pad,
                                         eos_token=pad, padding_side="left").save_pretrained(directory)
    files = {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
        "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False},
        "config_sentence_transformers.json": {"prompts": prompts, "default_prompt_name": None,
                                              "similarity_fn_name": "cosine"},
        "1_Pooling/config.json": {"word_embedding_dimension": config.hidden_size, "pooling_mode_cls_token": False,
                                  "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
                                  "pooling_mode_mean_sqrt_len_tokens": False,
                                  "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": True,
                                  "include_prompt": True}}
    for name, content in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(json.dumps(content, indent=2))
    (directory / "2_Normalize").mkdir(exist_ok=True)
    return directory


SHAPES = {"qwen3-embedding-0.6b": save_qwen3, "embeddinggemma-300m": save_embeddinggemma,
          "qwen3-embedding-4b": lambda directory, seed=0: save_qwen3_large(directory, "4b", seed),
          "qwen3-embedding-8b": lambda directory, seed=0: save_qwen3_large(directory, "8b", seed),
          "e5-mistral-7b": save_e5_mistral}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    SHAPES[args.shape](args.directory, args.seed)
    print(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
