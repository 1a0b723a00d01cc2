"""What JSON Schema cannot say about three of attnserve's bodies, told to schemathesis's generator
(tests/test_http_schemathesis.py loads this module through SCHEMATHESIS_HOOKS).

/openapi.json states every other rule the doors hold a body to (non-empty texts, token ids below the vocabulary,
layers, heads, dimensions, prompt names and tasks the model has, KServe's tensor names, datatypes and shapes). Two
rules relate one field's length to another field's value, which JSON Schema has no word for; each is said in the
field's description, and the server refuses a body that breaks it, naming both fields:
- a KServe tensor's shape is the count of its data's elements ([N] or [N, 1]);
- /embed's int8 and uint8 `ranges` have one column per dimension returned (`dimensions`, where it is set), and
  each column's minimum (first row) is at most its maximum (second row);
- /embed_chunks's `spans` are one list per input, each span [start, stop) inside its text with a token starting
  in it (which the tokenizer decides: a text here is made to start with a letter, and its span to cover it).
A schema-valid body that schemathesis generates (positive mode only) is made to keep them. Negative cases, which
must be refused, are left as generated; every check stays on for every operation.
"""

from __future__ import annotations

import schemathesis
from schemathesis import GenerationMode


@schemathesis.hook
def map_case(context, case):
    meta = case.meta
    if meta is None or meta.generation.mode is not GenerationMode.POSITIVE or not isinstance(case.body, dict):
        return case
    body = case.body
    for tensor in body.get("inputs") or ():
        if isinstance(tensor, dict) and isinstance(tensor.get("data"), list) and isinstance(tensor.get("shape"), list):
            count = len(tensor["data"])  # each element a text, or a row [text] of a [N, 1] tensor
            tensor["shape"] = [count] if len(tensor["shape"]) == 1 else [count, 1]
    ranges, dimensions = body.get("ranges"), body.get("dimensions")
    if isinstance(dimensions, float) and dimensions.is_integer():  # 69.0 is JSON Schema's integer 69 too
        dimensions = int(dimensions)
    if isinstance(ranges, list) and isinstance(dimensions, int) and not isinstance(dimensions, bool):
        ranges = body["ranges"] = [row[:dimensions] if isinstance(row, list) else row for row in ranges]
    if isinstance(ranges, list) and len(ranges) == 2 and all(isinstance(row, list) for row in ranges):
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
