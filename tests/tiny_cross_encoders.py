"""Tiny random-weight cross-encoders of every family, saved as real folders by transformers' own
XForSequenceClassification classes and then by sentence-transformers' CrossEncoder, as rerankers are published.

Each has one label (CrossEncoder's Sigmoid activation) and a real tokenizer of its family's kind (checkpoints.py
save_tiny_family, save_tiny_modernbert, tiny_deberta.py): WordPiece for DistilBERT and DeBERTa, byte-level BPE for
RoBERTa, MPNet and ModernBERT, Unigram for XLM-R with bge-reranker-v2-m3's pair template "<s> A </s> </s> B </s>".
The tokenizers of families without token types name only input_ids and attention_mask as their model inputs, as those
families' tokenizers do.
Weights are drawn wider than transformers' initialisation, so that the scores spread over the sigmoid.
"""

from __future__ import annotations

from pathlib import Path

from .checkpoints import FAMILY_CLASSES, as_cross_encoder, edit_json, save_tiny_family, save_tiny_modernbert
from .tiny_deberta import save_tiny_deberta

# The architectures these makers cover, with ModernBERT's two poolings (BERT's: checkpoints.save_cross_encoder).
ALL = ("roberta", "xlm-roberta", "distilbert", "mpnet", "modernbert-cls", "modernbert-mean", "deberta-v2")
NO_TOKEN_TYPES = ["input_ids", "attention_mask"]


def save_tiny_cross_encoder(directory: Path, kind: str, seed: int = 0, **modernbert_config) -> Path:
    """A cross-encoder of `kind` (one of ALL) saved by CrossEncoder into directory. modernbert_config: ModernBertConfig
    settings for the modernbert kinds (max_position_embeddings for a long-context one)."""
    def save(staging: Path) -> None:
        if kind.startswith("modernbert"):
            save_tiny_modernbert(staging, "ModernBertForSequenceClassification", seed, num_labels=1,
                                 classifier_pooling=kind.removeprefix("modernbert-"), **modernbert_config)
            edit_json(staging / "tokenizer_config.json", model_input_names=NO_TOKEN_TYPES)
            return
        if kind == "deberta-v2":  # mxbai-rerank-base/large-v1's architecture, at DeBERTa-v3's settings
            save_tiny_deberta(staging, "DebertaV2ForSequenceClassification", seed, num_labels=1)
            return
        head = FAMILY_CLASSES[kind][1].replace("Model", "ForSequenceClassification")
        save_tiny_family(staging, kind, head, seed, spread=0.3, tokenizer={"model_input_names": NO_TOKEN_TYPES},
                         pairs=kind == "xlm-roberta", num_labels=1)
    return as_cross_encoder(directory, save)


def save_minilm_cross_encoder(directory: Path, seed: int = 0) -> Path:
    """A BertForSequenceClassification of real size and real encoder weights: all-MiniLM-L6-v2's encoder and
    pooler (the default model, nothing downloaded) under a random one-label classifier, drawn so that the logits
    spread over a few units (std 0.2 over 384 tanh features); truncated at 256 tokens as all-MiniLM-L6-v2. Its
    int8 error is that of a trained encoder, which the tiny random models' is not."""
    import torch
    import transformers
    from safetensors.torch import load_file

    from attnserve.default_model import default_checkpoint_dir

    source = default_checkpoint_dir()
    config = transformers.BertConfig.from_pretrained(str(source), num_labels=1,
                                                     architectures=["BertForSequenceClassification"])
    model = transformers.BertForSequenceClassification(config)
    encoder = {f"bert.{k}": v for k, v in load_file(str(source / "model.safetensors")).items()}
    torch.manual_seed(seed)
    classifier = {"classifier.weight": 0.2 * torch.randn(1, config.hidden_size), "classifier.bias": torch.zeros(1)}
    model.load_state_dict({**encoder, **classifier}, strict=False)

    def save(staging: Path) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        transformers.AutoTokenizer.from_pretrained(str(source)).save_pretrained(staging)
    return as_cross_encoder(directory, save, max_length=256)  # MiniLM's max_seq_length
