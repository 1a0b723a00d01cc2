"""What JSON Schema cannot say about attnserve's bodies, told to schemathesis's generator
(tests/test_http_schemathesis.py loads this module through SCHEMATHESIS_HOOKS).

/openapi.json states every other rule; these five it says in words, and the server refuses a body that breaks one,
naming the field: an input longer than the model's max_seq_length tokens is refused where the body asks not to truncate
(truncate false, Cohere's "NONE", KServe's and TEI's parameters.truncate false: a token count is the tokenizer's, past
any schema; a tiny model's 16 tokens are a few generated characters); an integer is a JSON integer, 8 and not 8.0 (JSON
Schema's integer admits 8.0); a KServe tensor's shape counts its data's elements ([N] or [N, 1]); /embed's int8 and
uint8 `ranges` have a column per dimension returned, each minimum (first row) at most its maximum (second row);
/embed_chunks's `spans` are one list per input, each span inside its text with a token starting in it (a text here
starts with a letter, its span covers it).
A schema-valid body schemathesis generates (positive mode only) is made to keep them and stays schema-valid
(schemathesis validates a body a hook sets again); negative cases, which must be refused, are left as generated.
"""

from __future__ import annotations

import schemathesis
from schemathesis import GenerationMode


@schemathesis.hook
def map_case(context, case):
    meta = case.meta
    if meta is None or meta.generation.mode is not GenerationMode.POSITIVE or not isinstance(case.body, dict):
        return case
    body = case.body = _integers(case.body)
    for holder in (body, body.get("parameters")):
        if isinstance(holder, dict) and holder.get("truncate") in (False, "NONE"):
            holder["truncate"] = True if holder["truncate"] is False else "END"
    for tensor in body.get("inputs") or ():
        if isinstance(tensor, dict) and isinstance(tensor.get("data"), list) and isinstance(tensor.get("shape"), list):
            count = len(tensor["data"])  # each element a text, or a row [text] of a [N, 1] tensor
            tensor["shape"] = [count] if len(tensor["shape"]) == 1 else [count, 1]
    ranges, dimensions = body.get("ranges"), body.get("dimensions")
    if isinstance(ranges, list) and len(ranges) == 2 and all(isinstance(row, list) and row for row in ranges):
        if isinstance(dimensions, int) and not isinstance(dimensions, bool):  # as many columns as dimensions
            dimensions = body["dimensions"] = min(dimensions, *map(len, ranges))
            ranges = [row[:dimensions] for row in ranges]
        pairs = [sorted(pair) if all(isinstance(v, (int, float)) for v in pair) else list(pair)
                 for pair in zip(*ranges, strict=False)]
        body["ranges"] = [[low for low, _ in pairs], [high for _, high in pairs]]
    if isinstance(body.get("spans"), list) and isinstance(body.get("inputs"), (str, list)):
        texts = [body["inputs"]] if isinstance(body["inputs"], str) else body["inputs"]
        if all(isinstance(text, str) for text in texts):
            texts = ["x" + text for text in texts]
            body["inputs"] = texts[0] if isinstance(body["inputs"], str) else texts
            body["spans"] = [[[0, len(text)]] for text in texts]
    return case


def _integers(value):
    """value with every whole float written as an integer (8.0 -> 8): an integer field takes only that spelling, and
    a number field (ranges) takes either."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:  # exactly an integer
        return int(value)
    if isinstance(value, list):
        return [_integers(item) for item in value]
    if isinstance(value, dict):
        return {key: _integers(item) for key, item in value.items()}
    return value
