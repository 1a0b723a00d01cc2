"""Sentence pairs in the tokenizer: the checkpoint's own pair template and token types, longest-first truncation as
the tokenizers library does it, from bounded prefixes of long texts; our encoder's token types against BertModel."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tokenizers import Tokenizer

from attnserve.default_model import default_checkpoint_dir
from attnserve.engine.tokenizer import TextTokenizer
from attnserve.errors import InvalidInputError

WORDS = "the cat sat on a mat because it was tired and unbelievably hungry , ! naïve café 東京".split()
TOKENIZER = default_checkpoint_dir() / "tokenizer.json"


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _whole_pair(max_seq_length: int, a: str, b: str, direction: str = "right"):
    """The tokenizers library's own pair encoding of the whole texts, truncated longest-first."""
    whole = Tokenizer.from_file(str(TOKENIZER))
    whole.no_padding()
    whole.enable_truncation(max_seq_length, direction=direction)
    return whole.encode(a, b)


def test_pairs_match_transformers_tokenizer():
    """BERT's "[CLS] a [SEP] b [SEP]", type 1 for b, truncated as transformers' tokenizer over the same folder
    does (longest first), at lengths around half of the room (253 tokens: odd) and far past it."""
    import transformers

    ours = TextTokenizer(TOKENIZER, 256, 30522)
    theirs = transformers.AutoTokenizer.from_pretrained(str(default_checkpoint_dir()))
    rng = random.Random(0)
    sizes = [1, 7, 60, 125, 126, 127, 128, 200, 300, 2000]
    pairs = [(_text(rng, la), _text(rng, lb)) for la in sizes for lb in sizes]
    want = theirs([a for a, _ in pairs], [b for _, b in pairs], truncation=True, max_length=256)
    for x, ids, types, (a, b) in zip(ours.encode_pairs(pairs), want["input_ids"], want["token_type_ids"], pairs,
                                     strict=True):
        assert x.ids.tolist() == ids and x.type_ids.tolist() == types, (len(a), len(b))
        assert x.truncated == (len(theirs(a, b)["input_ids"]) > 256)
        assert x.pair_start == ids.index(theirs.sep_token_id) + 1
        assert types[x.pair_start] == 1 and types[x.pair_start - 1] == 0


def _longest_first(la: int, lb: int, room: int) -> tuple[int, int]:
    """How many tokens each side keeps: the rule of tokenizers' utils/truncation.rs, transcribed."""
    if la + lb <= room:
        return la, lb
    n1, n2, swap = (lb, la, True) if la > lb else (la, lb, False)  # n1: the shorter, a on a tie
    n2 = n1 if n1 > room else max(n1, room - n1)
    if n1 + n2 > room:
        n1, n2 = room // 2, room // 2 + room % 2
    return (n2, n1) if swap else (n1, n2)


@pytest.mark.parametrize("max_seq_length", [16, 17])  # room for 13 (odd: the shorter side keeps one less) and 14
def test_prefixes_give_the_whole_texts_result(max_seq_length):
    """Long sides are tokenized from bounded prefixes (TextTokenizer._pair); the result is the library's on the
    whole texts, for every combination of short, half-room and long sides, ties and near-ties included. Where
    both sides are long, the library's own pair encoding would build the product of both sides' overflowing
    windows (gigabytes); there the whole sides, tokenized alone, are cut by the library's rule transcribed."""
    ours = TextTokenizer(TOKENIZER, max_seq_length, 30522)
    alone = Tokenizer.from_file(str(TOKENIZER))
    alone.no_truncation()
    alone.no_padding()
    rng = random.Random(1)
    sizes = [1, 3, 6, 7, 8, 13, 14, 15, 200, 201, 5000]
    for la in sizes:
        for lb in sizes:
            a, b = _text(rng, la), _text(rng, lb)
            x = ours.encode_pairs([(a, b)])[0]
            if la * lb <= 5000 * 15:
                whole = _whole_pair(max_seq_length, a, b)
                assert x.ids.tolist() == whole.ids and x.type_ids.tolist() == whole.type_ids, (la, lb)
                assert x.truncated == bool(whole.overflowing)
            ids_a, ids_b = (alone.encode(t, add_special_tokens=False).ids for t in (a, b))
            keep_a, keep_b = _longest_first(len(ids_a), len(ids_b), max_seq_length - 3)
            assert x.ids.tolist() == [101, *ids_a[:keep_a], 102, *ids_b[:keep_b], 102], (la, lb)
            assert x.truncated == (len(ids_a) + len(ids_b) > max_seq_length - 3)


def test_equal_long_sides_and_left_truncation_keep_the_librarys_rules():
    """Two sides longer than any prefix, whose order only whole tokenization tells: both orders and a tie."""
    ours = TextTokenizer(TOKENIZER, 16, 30522)
    long_a, long_b = "cat " * 300, "cat " * 299
    for a, b in ((long_a, long_b), (long_b, long_a), (long_a, long_a)):
        assert ours.encode_pairs([(a, b)])[0].ids.tolist() == _whole_pair(16, a, b).ids
    rng = random.Random(2)
    for la, lb in ((30, 4), (4, 30), (40, 40), (3, 3)):
        a, b = _text(rng, la), _text(rng, lb)
        assert ours.encode_pairs([(a, b)], direction="left")[0].ids.tolist() == _whole_pair(16, a, b, "left").ids


def test_pair_errors_name_the_input_and_side():
    ours = TextTokenizer(TOKENIZER, 16, 30522)
    with pytest.raises(InvalidInputError, match="^input 1: text b: empty text$"):
        ours.encode_pairs([("a", "b"), ("a", "  ")])
    with pytest.raises(InvalidInputError, match="^input 0: the pair is longer than max_seq_length 16 tokens"):
        ours.encode_pairs([("cat " * 10, "cat " * 10)], truncate=False)
    with pytest.raises(InvalidInputError, match="^input 0: a pair must be two texts$"):
        ours.encode_pairs([("a", "b", "c")])  # type: ignore[list-item]


def test_long_pair_costs_memory_of_the_limit_not_the_text():
    """Two sides of 20 MB each are tokenized as prefixes (with an even room, 252 tokens, the order of two long
    sides cannot matter): the peak grows far less than tokenizing 40 MB whole costs (about 70 bytes a
    character), and the result is that of short texts that the cut reaches just as well."""
    import resource

    ours = TextTokenizer(TOKENIZER, 255, 30522)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    x = ours.encode_pairs([("cat " * 5_000_000, "a dog sat " * 2_000_000)])[0]
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200, f"peak grew by {grown_mib:.0f} MiB"
    short = _whole_pair(255, "cat " * 600, "a dog sat " * 300)
    assert x.ids.tolist() == short.ids and x.type_ids.tolist() == short.type_ids and x.truncated


def test_encoder_token_types_match_transformers_bert():
    """Our encoder with token_type_ids against transformers' BertModel on the same random-weight checkpoint."""
    import torch
    import transformers

    from attnserve.model.encoder import Encoder, EncoderConfig
    from attnserve.model.families import key_map

    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    theirs = transformers.BertModel(config, add_pooling_layer=False).eval()
    ours = Encoder(EncoderConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                 max_position_embeddings=64)).eval()
    state = theirs.state_dict()
    ours.load_state_dict({o: state[t] for t, o in key_map(ours.config).items()})
    ids = torch.randint(5, 100, (3, 12))
    mask = torch.ones_like(ids)
    mask[2, 8:] = 0
    types = (torch.arange(12) >= 5).long().expand(3, 12).clone()
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        got, _ = ours(ids, mask, token_type_ids=types)
    assert float((got - want).abs()[mask.bool()].max()) <= 1e-5
    assert not np.allclose(got.numpy(), ours(ids, mask)[0].detach().numpy(), atol=1e-3)  # types change the output
