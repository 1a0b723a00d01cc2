"""Real checkpoint folders for the tests, made with the libraries' own classes: tiny random-weight models saved by
transformers with real tokenizers (`tokenizers`' WordPiece here, the other kinds in tiny_tokenizers.py),
sentence-transformers pipelines and CrossEncoder folders saved by sentence-transformers, and CLIP's and SigLIP's
image-text models. The default checkpoint is copied cheaply: its large files are linked, the small ones copied so
that a test can change them.
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
# The specials of RoBERTa's and XLM-R's tokenizers, as transformers names them.
ROBERTA_SPECIALS = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                        cls_token="<s>", sep_token="</s>")


def tiny_vocab(size: int) -> dict[str, int]:
    """Special tokens, letters, their continuations, then two-letter pieces and continuations until `size`."""
    pieces = list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase] + list(".,!?'-")
    pairs = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2)]
    pieces += itertools.islice(pairs + [f"##{p}" for p in pairs], max(0, size - len(SPECIALS) - len(pieces)))
    tokens = (SPECIALS + pieces)[:size]
    assert len(tokens) == size, f"cannot make a vocabulary of {size}"
    return {t: i for i, t in enumerate(tokens)}


def save_wordpiece_tokenizer(directory: Path, vocab_size: int, **options) -> None:
    """BERT's lowercasing WordPiece over tiny_vocab(vocab_size), saved by transformers (options: its settings)."""
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
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", **options).save_pretrained(directory)


def save_tiny_bert(directory: Path, vocab_size: int = 64, model_class: str = "BertModel", seed: int = 0) -> Path:
    """A 2-layer, hidden-32 BERT with random weights and a lowercasing WordPiece tokenizer of `vocab_size`."""
    import torch
    import transformers

    save_wordpiece_tokenizer(directory, vocab_size)
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(seed)
    getattr(transformers, model_class)(config).save_pretrained(directory, safe_serialization=True)
    return directory


def is_norm_weight(name: str) -> bool:
    return "norm" in name.lower() and name.endswith("weight")


def save_model(directory: Path, config, model_class: str, seed: int = 0, spread: float = 0.2, offset: float = 1.0,
               norm=is_norm_weight) -> None:
    """transformers' `model_class` over `config`, its weights drawn wider than transformers' initialisation (whose
    attention would be nearly uniform): norm(name)'s around `offset` (spread 0.3), the rest `spread` around 0, so
    that every part of the model shows."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(offset + 0.3 * torch.randn_like(param) if norm(name) else spread * torch.randn_like(param))
    model.save_pretrained(directory, safe_serialization=True)


def save_fast_tokenizer(directory: Path, tokenizer_file: Path, **options) -> None:
    """The tokenizers file as transformers' PreTrainedTokenizerFast saves it, with options (specials, padding side,
    model_max_length)."""
    import transformers
    from tokenizers import Tokenizer

    transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(tokenizer_file)),
                                         **options).save_pretrained(directory)


def save_tiny_modernbert(directory: Path, model_class: str = "ModernBertModel", seed: int = 0, **config) -> Path:
    """A 4-layer, hidden-64 ModernBERT (layers 0 and 3 global, 1 and 2 local with a window of 8, so that the local
    attention matters from 5 tokens on) with wide random weights (save_model) and a byte-level BPE tokenizer as
    ModernBERT's (tiny_tokenizers.py). config: ModernBertConfig settings over these."""
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
    save_model(directory, config, model_class, seed)
    save_fast_tokenizer(directory, directory / "tokenizer.json", unk_token="[UNK]", pad_token="[PAD]",
                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                        model_max_length=config.max_position_embeddings)
    return directory


def save_rotary_bert(directory: Path, config_class: str, model_class: str, seed: int, **settings) -> Path:
    """A 3-layer, hidden-64, 4-head model of BERT's layout with 128 positions (GTE, NomicBERT), wide random weights
    (save_model) and a lowercasing WordPiece tokenizer of 200 pieces; settings: config_class's over these."""
    import transformers

    save_wordpiece_tokenizer(directory, 200, model_max_length=128)
    sizes = dict(vocab_size=200, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
                 max_position_embeddings=128)
    save_model(directory, getattr(transformers, config_class)(**{**sizes, **settings}), model_class, seed)
    return directory


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


def save_tiny_family(directory: Path, family: str, model_class: str | None = None, seed: int = 0,
                     spread: float | None = None, tokenizer: dict | None = None, pairs: bool = False,
                     **config) -> Path:
    """A 2-layer, hidden-32 model of `family` with random weights (spread: drawn that wide, save_model), saved by
    transformers' own class, and a real tokenizer of the family's kind (tokenizer: its settings): WordPiece for BERT
    and DistilBERT (as save_tiny_bert's), byte-level BPE for RoBERTa and MPNet, Unigram over Metaspace for XLM-R
    (tiny_tokenizers.py; pairs: bge-reranker-v2-m3's pair template; their <pad> is id 1, as in those families).
    RoBERTa-style positions start after the padding index: the table has 2 more rows than the 64 positions inputs
    may use. config: the config class's settings over these."""
    import torch
    import transformers

    from .tiny_tokenizers import roberta_style, xlmr_style

    if family in ("bert", "distilbert"):
        save_wordpiece_tokenizer(directory, 64, **(tokenizer or {}))
        vocab_size, positions = 64, 64
    else:
        directory.mkdir(parents=True)
        tokenizer_file = xlmr_style(directory / "tokenizer.json", pairs) if family == "xlm-roberta" else \
            roberta_style(directory / "tokenizer.json")
        save_fast_tokenizer(directory, tokenizer_file, model_max_length=64, **ROBERTA_SPECIALS, **(tokenizer or {}))
        vocab_size, positions = len(json.loads(tokenizer_file.read_text())["model"]["vocab"]), 66
    config_class, bare_class, sizes = FAMILY_CLASSES[family]
    config = getattr(transformers, config_class)(vocab_size=vocab_size, max_position_embeddings=positions,
                                                 **sizes, **config)
    if spread is not None:
        save_model(directory, config, model_class or bare_class, seed, spread)
    else:
        torch.manual_seed(seed)
        getattr(transformers, model_class or bare_class)(config).save_pretrained(directory, safe_serialization=True)
    return directory


def as_cross_encoder(directory: Path, save, **options) -> Path:
    """save(folder) writes a transformers XForSequenceClassification folder; sentence-transformers' CrossEncoder
    (options: its settings) saves it into `directory` as rerankers are published (modules.json,
    config_sentence_transformers.json with its activation)."""
    from sentence_transformers import CrossEncoder

    staging = directory.parent / f"{directory.name}.hf"
    save(staging)
    CrossEncoder(str(staging), device="cpu", **options).save(str(directory))
    shutil.rmtree(staging)
    return directory


def save_cross_encoder(directory: Path, tokenizer_dir: Path, seed: int = 0, labels: list[str] | None = None,
                       problem_type: str | None = None) -> Path:
    """A 2-layer, hidden-32 BertForSequenceClassification (one label, or `labels` named in id2label, with
    `problem_type`) with `tokenizer_dir`'s tokenizer, as CrossEncoder saves it. Its weights are drawn wider than
    transformers' default initialisation (0.5, not 0.02), so that the scores spread over the sigmoid."""
    import torch
    import transformers

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

    def save(staging: Path) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        vocab.save_pretrained(staging)
    return as_cross_encoder(directory, save)


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


def save_sentence_transformer(model_dir: Path, directory: Path, pooling: str = "mean", normalize: bool = True,
                              max_seq_length: int | None = None, **model_options) -> Path:
    """sentence-transformers' own save of Transformer -> Pooling [-> Normalize] over `model_dir`."""
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    return save_pipeline(model_dir, directory, lambda size: [Pooling(size, pooling)] + [Normalize()] * normalize,
                         max_seq_length, **model_options)


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
