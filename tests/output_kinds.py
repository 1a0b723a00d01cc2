"""What the tests of the outputs beside dense embeddings (SPLADE, ColBERT, bge-m3, scores, long inputs) share: a gRPC
refusal, a tiny BERT on MiniLM's tokenizer, the export, replies held to /openapi.json, a run stopped and resumed."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import requests

from .conftest import run_cli
from .offline_helpers import clean_run, encoded, text_file


def grpc_refusal(call, request, code=grpc.StatusCode.INVALID_ARGUMENT, **options) -> str:
    """The details of a gRPC call's refusal, whose status must be `code`."""
    with pytest.raises(grpc.RpcError) as raised:
        call(request, **options)
    assert raised.value.code() == code, raised.value.details()
    return raised.value.details()


def tiny_bert_config():
    """(MiniLM's tokenizer, a 2-layer hidden-32 BertConfig over it with weights drawn wider than transformers' 0.02)."""
    import transformers

    from attnserve.default_model import default_checkpoint_dir

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_checkpoint_dir()))
    return tokenizer, transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                                              initializer_range=0.2)


def export(checkpoint: Path, out: Path, variants: list[str] | None = None) -> Path:
    """Every variant (None), as `attnserve export --all`, or those named."""
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    build_artifacts(read_checkpoint(checkpoint), out, log=lambda m: None, variants=variants)
    return out


def assert_answers_as_openapi_says(server, calls) -> None:
    """Each call's reply is valid under /openapi.json's schema of it (calls: tests/test_http_openapi.py's)."""
    from jsonschema import Draft202012Validator

    from .test_http_openapi import call, schema_of

    spec = requests.get(f"{server.http_url}/openapi.json", timeout=60).json()
    for method, path, body in calls:
        reply = call(server, method, path, body)
        assert reply.status_code == 200, reply.text
        Draft202012Validator(schema_of(spec, method, path, "200")).validate(reply.json())


def stopped_then_resumed(source: Path, texts: list[str], *flags) -> Path:
    """An offline run in chunks of 3 rows stopped by a bad line 7, then resumed once it is fixed: it ends with the
    bytes of a run never stopped (clean.parquet beside it). Returns its output, holding texts."""
    out, chunked = source.with_name("resumed.parquet"), (*flags, "--chunk-rows", "3")
    stopped = run_cli("encode", text_file(source, [*texts[:6], "   ", *texts[7:]]), "-o", out, *chunked,
                      "--no-progress")
    assert stopped.returncode != 0 and "line 7: empty text" in stopped.stderr
    assert "(resumed after 6 rows)" in encoded(text_file(source, texts), out, *chunked).stdout
    assert out.read_bytes() == clean_run(source, *chunked).read_bytes()
    return out
