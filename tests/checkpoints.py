"""Real checkpoint folders for the export's tests, made with the libraries' own classes.

Tiny random-weight BERTs are saved by transformers (BertModel, BertForMaskedLM,
BertForSequenceClassification), their WordPiece tokenizers built with `tokenizers`, and so are tiny
ModernBERTs (ModernBertModel, with a byte-level BPE tokenizer),
and sentence-transformers pipelines saved by sentence-transformers itself. The
default checkpoint is copied cheaply: its large files are linked, the small ones
copied so that a test can change them.
"""

from __future__ import annotations

import itertools
import json
import shutil
import string
from pathlib import Path

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Large files that no test changes: linked, not copied (all-MiniLM-L6-v2's weights are 90 MB).
LINKED = ("model.safetensors", "tokenizer.json", "vocab.txt")


def tiny_vocab(size: int) -> dict[str, int]:
    """Special tokens, letters, their continuations, then two-letter pieces and continuations until `size`."""
    pieces = list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase] + list(".,!?'-")
    pairs = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2)]
    pieces += itertools.islice(pairs + [f"##{p}" for p in pairs], max(0, size - len(SPECIALS) - len(pieces)))
    tokens = (SPECIALS + pieces)[:size]
    assert len(tokens) == size, f"cannot make a vocabulary of {size}"
    return {t: i for i, t in enumerate(tokens)}


def save_tiny_bert(directory: Path, vocab_size: int = 64, model_class: str = "BertModel", seed: int = 0) -> Path:
    """A 2-layer, hidden-32 BERT with random weights and a lowercasing WordPiece tokenizer of `vocab_size`."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = tiny_vocab(vocab_size)
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer.decoder = decoders.WordPiece()
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(seed)
    getattr(transformers, model_class)(config).save_pretrained(directory, safe_serialization=True)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]").save_pretrained(directory)
    return directory


def save_tiny_modernbert(directory: Path, model_class: str = "ModernBertModel", seed: int = 0, **config) -> Path:
    """A 4-layer, hidden-64 ModernBERT (layers 0 and 3 global, 1 and 2 local with a window of 8, so that the local
    attention matters from 5 tokens on) with random weights larger than transformers' initialisation, whose
    attention would otherwise be nearly uniform, and a byte-level BPE tokenizer as ModernBERT's (tiny_tokenizers.py).
    config: ModernBertConfig settings over these."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    from .tiny_tokenizers import modernbert_style

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(modernbert_style(directory / "tokenizer.json")))
    ids = {t: tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")}
    settings = dict(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, num_hidden_layers=4,
                    num_attention_heads=4, intermediate_size=96, max_position_embeddings=128,
                    global_attn_every_n_layers=3, local_attention=8, global_rope_theta=1000.0,
                    local_rope_theta=100.0, pad_token_id=ids["[PAD]"], bos_token_id=ids["[CLS]"],
                    cls_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"], sep_token_id=ids["[SEP]"])
    config = transformers.ModernBertConfig(**{**settings, **config})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # LayerNorm weights around 1, everything else a wide spread: every part of the model shows.
            param.copy_(1 + 0.3 * torch.randn_like(param) if "norm" in name and name.endswith("weight")
                        else 0.2 * torch.randn_like(param))
    model.save_pretrained(directory, safe_serialization=True)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_max_length=config.max_position_embeddings).save_pretrained(directory)
    return directory


def save_cross_encoder(directory: Path, tokenizer_dir: Path, seed: int = 0, labels: list[str] | None = None,
                       problem_type: str | None = None) -> Path:
    """A 2-layer, hidden-32 BertForSequenceClassification (one label, or `labels` named in id2label, with
    `problem_type`) with `tokenizer_dir`'s tokenizer, saved by sentence-transformers' CrossEncoder as it saves
    rerankers (modules.json, config_sentence_transformers.json with its activation). Its weights are drawn wider
    than transformers' default initialisation (0.5, not 0.02), so that the scores spread over the sigmoid rather
    than all sitting at one value."""
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    vocab = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64,
                                     num_labels=len(labels) if labels else 1, initializer_range=0.5,
                                     problem_type=problem_type)
    if labels:
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(config)
    staging = directory.parent / f"{directory.name}.hf"
    model.save_pretrained(staging, safe_serialization=True)
    vocab.save_pretrained(staging)
    CrossEncoder(str(staging), device="cpu").save(str(directory))
    shutil.rmtree(staging)
    return directory


def save_sentence_transformer(model_dir: Path, directory: Path, pooling: str = "mean", normalize: bool = True,
                              max_seq_length: int | None = None) -> Path:
    """sentence-transformers' own save of Transformer -> Pooling [-> Normalize] over `model_dir`."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(str(model_dir), max_seq_length=max_seq_length)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling)]
    SentenceTransformer(modules=modules + ([Normalize()] if normalize else []), device="cpu").save(str(directory))
    return directory


def save_pipeline(model_dir: Path, directory: Path, after_transformer, max_seq_length: int | None = None,
                  **model_options) -> Path:
    """sentence-transformers' own save of Transformer -> after_transformer(embedding dimension) over `model_dir`;
    model_options (prompts, default_prompt_name) go to SentenceTransformer."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Transformer

    transformer = Transformer(str(model_dir), max_seq_length=max_seq_length)
    modules = [transformer, *after_transformer(transformer.get_embedding_dimension())]
    SentenceTransformer(modules=modules, device="cpu", **model_options).save(str(directory))
    return directory


def add_module(ckpt: Path, position: int, folder: str, module) -> None:
    """Save a sentence-transformers module into ckpt/folder and insert it into modules.json at `position`."""
    (ckpt / folder).mkdir()
    module.save(str(ckpt / folder))
    modules = json.loads((ckpt / "modules.json").read_text())
    kind = f"sentence_transformers.models.{type(module).__name__}"
    modules.insert(position, {"idx": position, "name": str(position), "path": folder, "type": kind})
    (ckpt / "modules.json").write_text(json.dumps(modules))


def copy_checkpoint(source: Path, directory: Path) -> Path:
    """A copy whose small files can be changed; the large ones are links to the original."""
    directory.mkdir(parents=True)
    for item in source.iterdir():
        if item.name in LINKED:
            (directory / item.name).symlink_to(item)
        elif item.is_dir():
            shutil.copytree(item, directory / item.name)
        else:
            shutil.copyfile(item, directory / item.name)
    return directory


def edit_json(path: Path, **changes) -> None:
    """Set (or, with None, remove) top-level keys of a JSON object file."""
    raw = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    path.write_text(json.dumps(raw, indent=2), encoding="utf-8")


# (transformers config class, bare model class, config.json's size names) of each family's tiny model.
TINY_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
DISTILBERT_SIZES = {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64}
FAMILY_CLASSES = {
    "bert": ("BertConfig", "BertModel", TINY_SIZES),
    "roberta": ("RobertaConfig", "RobertaModel", {**TINY_SIZES, "type_vocab_size": 1, "layer_norm_eps": 1e-5}),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel",
                    {**TINY_SIZES, "type_vocab_size": 1, "layer_norm_eps": 1e-5}),
    "distilbert": ("DistilBertConfig", "DistilBertModel", DISTILBERT_SIZES),
    "mpnet": ("MPNetConfig", "MPNetModel", {**TINY_SIZES, "layer_norm_eps": 1e-5}),
}


def save_tiny_family(directory: Path, family: str, model_class: str | None = None, seed: int = 0) -> Path:
    """A 2-layer, hidden-32 model of `family` with random weights, saved by transformers' own class, and a real
    tokenizer of the family's kind: WordPiece for BERT and DistilBERT (as save_tiny_bert's), byte-level BPE for
    RoBERTa and MPNet, Unigram over Metaspace for XLM-R (tiny_tokenizers.py; their <pad> is id 1, as in those
    families). RoBERTa-style positions start after the padding index: the table has 2 more rows than the 64
    positions inputs may use."""
    import torch
    import transformers

    from .tiny_tokenizers import roberta_style, xlmr_style

    if family in ("bert", "distilbert"):
        save_tiny_bert(directory, vocab_size=64, seed=seed)  # its tokenizer; the BERT weights are replaced below
        vocab_size, positions = 64, 64
    else:
        directory.mkdir(parents=True)
        tokenizer_file = (xlmr_style if family == "xlm-roberta" else roberta_style)(directory / "tokenizer.json")
        transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(tokenizer_file), bos_token="<s>", eos_token="</s>", unk_token="<unk>",
            pad_token="<pad>", mask_token="<mask>", cls_token="<s>", sep_token="</s>", model_max_length=64,
        ).save_pretrained(directory)
        vocab_size = json.loads(tokenizer_file.read_text())["model"]["vocab"].__len__()
        positions = 66
    config_class, bare_class, sizes = FAMILY_CLASSES[family]
    config = getattr(transformers, config_class)(vocab_size=vocab_size, max_position_embeddings=positions, **sizes)
    torch.manual_seed(seed)
    for stale in directory.glob("model*.safetensors"):
        stale.unlink()
    getattr(transformers, model_class or bare_class)(config).save_pretrained(directory, safe_serialization=True)
    return directory


# CLIP's tokenizer for a tiny CLIP: its byte-level BPE (each byte's character, and each as a word's end "</w>"), a
# few merges, and its two specials, in CLIP's own class (transformers' CLIPTokenizer, saved as tokenizer.json).
CLIP_MERGES = [("t", "h"), ("th", "e</w>"), ("a", "n"), ("an", "d</w>"), ("o", "f</w>"), ("c", "a"), ("ca", "t</w>"),
               ("d", "o"), ("do", "g</w>"), ("p", "h"), ("ph", "o"), ("pho", "t"), ("phot", "o</w>")]


def clip_tokenizer():
    """CLIP's tokenizer class over a tiny byte-level BPE (CLIP_MERGES)."""
    import transformers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    characters = list(bytes_to_unicode().values())
    tokens = characters + [c + "</w>" for c in characters] + [a + b for a, b in CLIP_MERGES]
    vocab = {t: i for i, t in enumerate(tokens + ["<|startoftext|>", "<|endoftext|>"])}
    return transformers.CLIPTokenizerFast(vocab=vocab, merges=list(CLIP_MERGES))


# The tiny image-text models' towers: 2 layers, hidden 64.
TINY_TOWER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def siglip_text_config(tokenizer) -> dict:
    """A tiny SigLIP (or SigLIP 2) text tower over clip_tokenizer's vocabulary: 64 positions every text is padded
    to, its special tokens the tokenizer's."""
    return {**TINY_TOWER, "vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.bos_token_id,
            "max_position_embeddings": 64}


def siglip_sentencepiece_tokenizer(directory: Path):
    """SigLIP's own tokenizer class (transformers' SiglipTokenizer, SentencePiece, no fast form) over a small Unigram
    model trained here on the sample texts, lowercased as SigLIP's is: its pad and end token "</s>", "<unk>"."""
    import io

    import sentencepiece
    import transformers

    texts = (Path(__file__).resolve().parent.parent / "export/data/sample_texts.txt").read_text().splitlines()
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([t.lower() for t in texts if t.strip()]), model_writer=model, vocab_size=300,
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
        unk_piece="<unk>", minloglevel=2, num_threads=1)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "spiece.model").write_bytes(model.getvalue())
    return transformers.SiglipTokenizer(vocab_file=str(directory / "spiece.model"))


def save_tiny_siglip(directory: Path, seed: int = 0, image_size: int = 32, patch_size: int = 8,
                     sentencepiece: bool = False) -> Path:
    """A small random-weight SiglipModel as transformers saves it, with a fast tokenizer (the tiny BPE of
    clip_tokenizer; SigLIP 2's is Gemma's) or SigLIP's own SentencePiece one (sentencepiece: its spiece.model and
    no tokenizer.json, as google/siglip-* ship it) and SigLIP's image processor (resized to image_size square, no
    crop): 2 layers a tower, hidden 64, 64 text positions every text is padded to."""
    import torch
    import transformers

    tokenizer = siglip_sentencepiece_tokenizer(directory) if sentencepiece else clip_tokenizer()
    torch.manual_seed(seed)
    config = transformers.SiglipConfig(
        text_config=siglip_text_config(tokenizer),
        vision_config={**TINY_TOWER, "image_size": image_size, "patch_size": patch_size})
    transformers.SiglipModel(config).eval().save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    transformers.SiglipImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(str(directory))
    return directory


def save_tiny_siglip2(directory: Path, seed: int = 0, num_patches: int = 16, patch_size: int = 8,
                      max_num_patches: int = 24) -> Path:
    """A small random-weight Siglip2Model (SigLIP 2's NaFlex towers) as transformers saves it, with a fast tokenizer
    (clip_tokenizer's tiny BPE; SigLIP 2's own is Gemma's) and its Siglip2ImageProcessor: each image resized to
    whole patches of patch_size px, at most max_num_patches of them (more than the num_patches position
    embeddings, whose 4 x 4 grid is then resized up and down); 2 layers a tower, hidden 64, 64 text positions."""
    import torch
    import transformers

    tokenizer = clip_tokenizer()
    torch.manual_seed(seed)
    config = transformers.Siglip2Config(
        text_config=siglip_text_config(tokenizer),
        vision_config={**TINY_TOWER, "num_patches": num_patches, "patch_size": patch_size})
    model = transformers.Siglip2Model(config).eval()
    with torch.no_grad():  # not the init's 0 and 0: the scale and bias are checked too
        model.logit_scale.fill_(2.3)
        model.logit_bias.fill_(-1.0)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    transformers.Siglip2ImageProcessor(patch_size=patch_size, max_num_patches=max_num_patches).save_pretrained(
        str(directory))
    return directory


def save_tiny_clip(directory: Path, seed: int = 0, image_size: int = 32, patch_size: int = 8) -> Path:
    """A small random-weight CLIPModel as transformers saves it with its CLIPProcessor (a CLIP tokenizer and image
    processor: shortest edge and center crop to image_size): 2 layers a tower, hidden 64, a 32-dimensional space."""
    import torch
    import transformers

    tokenizer = clip_tokenizer()
    torch.manual_seed(seed)
    config = transformers.CLIPConfig(
        text_config={**TINY_TOWER, "vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id,
                     "bos_token_id": tokenizer.bos_token_id, "pad_token_id": tokenizer.pad_token_id},
        vision_config={**TINY_TOWER, "image_size": image_size, "patch_size": patch_size}, projection_dim=32)
    transformers.CLIPModel(config).eval().save_pretrained(str(directory), safe_serialization=True)
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": image_size},
                                                crop_size={"height": image_size, "width": image_size})
    transformers.CLIPProcessor(image_processor=processor, tokenizer=tokenizer).save_pretrained(str(directory))
    return directory
