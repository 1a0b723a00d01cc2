"""Tiny jina-embeddings-v3 checkpoints saved by transformers and PEFT themselves: a 2-layer, hidden-32
JinaEmbeddingsV3Model with random weights wider than transformers' initialisation, an XLM-R-style tokenizer, and
one PEFT LoRA adapter per task under adapters/<task>/ whose B matrices are random too (PEFT starts them at zero,
which would make every task the base model)."""

from __future__ import annotations

from pathlib import Path

from attnserve.model.jina_v3 import ADAPTERS, TASKS

from .checkpoints import ROBERTA_SPECIALS, save_fast_tokenizer, save_model

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2", "word_embeddings"]


def save_tiny_jina(directory: Path, tasks: tuple[str, ...] = TASKS, seed: int = 0, rank: int = 4,
                   alpha: float = 4.0) -> Path:
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer

    from .tiny_tokenizers import xlmr_style

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(xlmr_style(directory / "tokenizer.json")))
    ids = {t: tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<pad>")}
    config = transformers.JinaEmbeddingsV3Config(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=128, pad_token_id=ids["<pad>"], bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"], rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        lora_adaptations=list(tasks))
    # The embeddings' LayerNorm bias is drawn around 1 as well.
    save_model(directory, config, "JinaEmbeddingsV3Model", seed,
               norm=lambda name: "LayerNorm" in name or "layernorm" in name and name.endswith("weight"))
    save_fast_tokenizer(directory, directory / "tokenizer.json", **ROBERTA_SPECIALS, model_max_length=128)
    for number, task in enumerate(tasks):
        base = transformers.JinaEmbeddingsV3Model.from_pretrained(str(directory))
        peft_model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha, target_modules=LORA_TARGETS))
        torch.manual_seed(seed + 1 + number)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_" in name:  # both factors random, so that each task's delta is large and its own
                    param.copy_(0.2 * torch.randn_like(param))
        peft_model.save_pretrained(str(directory / ADAPTERS / task), safe_serialization=True)
    return directory
