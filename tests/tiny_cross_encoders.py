"""Tiny random-weight cross-encoders of every family, saved as real folders by transformers' own
XForSequenceClassification classes and then by sentence-transformers' CrossEncoder, as rerankers are published.

Each has one label (CrossEncoder's Sigmoid activation) and a real tokenizer of its family's kind (tiny_tokenizers.py,
checkpoints.py): WordPiece for DistilBERT, byte-level BPE for RoBERTa, MPNet and ModernBERT, Unigram for XLM-R
with bge-reranker-v2-m3's pair template "<s> A </s> </s> B </s>". The tokenizers of families without token types
name only input_ids and attention_mask as their model inputs, as those families' tokenizers do. Weights are drawn
wider than transformers' initialisation, so that the scores spread over the sigmoid instead of sitting at one value.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# family -> (config class, ForSequenceClassification class, config.json sizes)
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
FAMILIES = {
    "roberta": ("RobertaConfig", "RobertaForSequenceClassification",
                {**TINY, "type_vocab_size": 1, "layer_norm_eps": 1e-5}),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaForSequenceClassification",
                    {**TINY, "type_vocab_size": 1, "layer_norm_eps": 1e-5}),
    "distilbert": ("DistilBertConfig", "DistilBertForSequenceClassification",
                   {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64}),
    "mpnet": ("MPNetConfig", "MPNetForSequenceClassification", {**TINY, "layer_norm_eps": 1e-5}),
}
# The architectures these makers cover, with ModernBERT's two poolings (BERT's: checkpoints.save_cross_encoder).
ALL = ("roberta", "xlm-roberta", "distilbert", "mpnet", "modernbert-cls", "modernbert-mean")
NO_TOKEN_TYPES = ["input_ids", "attention_mask"]


def _xlmr_pair_template(tokenizer_file: Path) -> None:
    """XLM-R's post-processor as bge-reranker-v2-m3's tokenizer.json has it, pairs included (all of type 0)."""
    from tokenizers import Tokenizer, processors

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ids = {t: tokenizer.token_to_id(t) for t in ("<s>", "</s>")}
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=list(ids.items()))
    tokenizer.save(str(tokenizer_file))


def _save_tokenizer(family: str, staging: Path) -> int:
    """The family's tiny tokenizer in staging; returns its vocabulary size."""
    import transformers

    from .checkpoints import save_tiny_bert
    from .tiny_tokenizers import roberta_style, xlmr_style

    if family == "distilbert":
        save_tiny_bert(staging, vocab_size=64)  # its tokenizer; the BERT weights are replaced
        for stale in staging.glob("model*.safetensors"):
            stale.unlink()
        (staging / "config.json").unlink()
        _edit(staging / "tokenizer_config.json", model_input_names=NO_TOKEN_TYPES)
        return 64
    staging.mkdir(parents=True)
    tokenizer_file = (xlmr_style if family == "xlm-roberta" else roberta_style)(staging / "tokenizer.json")
    if family == "xlm-roberta":
        _xlmr_pair_template(tokenizer_file)
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file), bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        mask_token="<mask>", cls_token="<s>", sep_token="</s>", model_max_length=64,
        model_input_names=NO_TOKEN_TYPES,
    ).save_pretrained(staging)
    return len(json.loads(tokenizer_file.read_text())["model"]["vocab"])


def _edit(path: Path, **changes) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw.update(changes)
    path.write_text(json.dumps(raw, indent=2), encoding="utf-8")


def _widen(model, scale: float = 0.3) -> None:
    """Weights drawn wider than transformers' 0.02, norms' weights around 1, so that every part shows in a score."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(1 + 0.3 * torch.randn_like(param) if "norm" in name.lower() and name.endswith("weight")
                        else scale * torch.randn_like(param))


def save_tiny_cross_encoder(directory: Path, kind: str, seed: int = 0, **modernbert_config) -> Path:
    """A cross-encoder of `kind` (one of ALL) saved by CrossEncoder into directory. modernbert_config: ModernBertConfig
    settings for the modernbert kinds (max_position_embeddings for a long-context one)."""
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    from .checkpoints import save_tiny_modernbert

    staging = directory.parent / f"{directory.name}.hf"
    if kind.startswith("modernbert"):
        save_tiny_modernbert(staging, "ModernBertForSequenceClassification", seed, num_labels=1,
                             classifier_pooling=kind.removeprefix("modernbert-"), **modernbert_config)
        _edit(staging / "tokenizer_config.json", model_input_names=NO_TOKEN_TYPES)
    else:
        vocab_size = _save_tokenizer(kind, staging)
        config_class, model_class, sizes = FAMILIES[kind]
        positions = 64 if kind == "distilbert" else 66  # RoBERTa-style positions start after the padding index
        config = getattr(transformers, config_class)(vocab_size=vocab_size, max_position_embeddings=positions,
                                                     num_labels=1, **sizes)
        torch.manual_seed(seed)
        model = getattr(transformers, model_class)(config)
        _widen(model)
        model.save_pretrained(staging, safe_serialization=True)
    CrossEncoder(str(staging), device="cpu").save(str(directory))
    shutil.rmtree(staging)
    return directory


def save_minilm_cross_encoder(directory: Path, seed: int = 0) -> Path:
    """A BertForSequenceClassification of real size and real encoder weights: all-MiniLM-L6-v2's encoder and
    pooler (the default model, nothing downloaded) under a random one-label classifier, drawn so that the logits
    spread over a few units (std 0.2 over 384 tanh features); truncated at 256 tokens as all-MiniLM-L6-v2. Its
    int8 error is that of a trained encoder, which the tiny random models' is not."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from sentence_transformers import CrossEncoder

    from attnserve.default_model import default_checkpoint_dir

    source = default_checkpoint_dir()
    config = transformers.BertConfig.from_pretrained(str(source), num_labels=1,
                                                     architectures=["BertForSequenceClassification"])
    model = transformers.BertForSequenceClassification(config)
    encoder = {f"bert.{k}": v for k, v in load_file(str(source / "model.safetensors")).items()}
    torch.manual_seed(seed)
    classifier = {"classifier.weight": 0.2 * torch.randn(1, config.hidden_size), "classifier.bias": torch.zeros(1)}
    model.load_state_dict({**encoder, **classifier}, strict=False)
    staging = directory.parent / f"{directory.name}.hf"
    model.save_pretrained(staging, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(str(source)).save_pretrained(staging)
    CrossEncoder(str(staging), device="cpu", max_length=256).save(str(directory))  # MiniLM's max_seq_length
    shutil.rmtree(staging)
    return directory
