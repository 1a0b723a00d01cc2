"""Quantized embeddings' reply sizes: each embedding type's reply bytes beside the float reply's, on every door.

One real `attnserve serve` on free loopback ports; one request for one text of the mixed corpus per door and type,
the reply's body bytes as they cross the wire (HTTP: the body, gRPC: the serialized EmbedResponse, KServe: the
JSON header and the binary tensors). The baseline is the float reply of the same door in its most compact form:
base64 where the door has it (OpenAI's /v1/embeddings, Cohere's base64 type), binary tensors on KServe, the
FLOAT32 tensor on gRPC. The ratio a vector database sees is the codes' bytes over float32's: 1/4 for int8 and
1/32 for the binary types, whatever the wire; what a reply adds around them (ids, the model's name, JSON
punctuation) is the rest.

    python bench/bench_quantized.py --artifacts /tmp/art
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

from attnserve.default_model import resolve_artifacts
from attnserve.server_process import ServerProcess
from attnserve.v1 import encoder_pb2 as pb

try:  # run as a script: bench/ is on sys.path
    from report import target_line
except ImportError:
    from bench.report import target_line

TEXT = "Quantized embeddings cut a vector database's memory four to thirty-two times."
TYPES = ("int8", "uint8", "binary", "ubinary")
TARGETS = {"ubinary_over_float_base64": ("<=", 0.05, "0.05")}  # issue 22: one 384-d vector


def post(url: str, body: dict, headers: dict | None = None) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return reply.read()


def kserve(server: ServerProcess, model: str, kind: str | None) -> int:
    """Bytes of a binary-tensor KServe reply: the JSON header and the tensor that follows it."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXT]}],
            "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}],
            "parameters": {"embedding_type": kind} if kind else {}}
    return len(post(f"{server.http_url}/v2/models/{model}/infer", body))


def measure(server: ServerProcess, model: str) -> dict[str, dict[str, int]]:
    sizes: dict[str, dict[str, int]] = {}
    with server.channel() as channel:
        stub = server.stub(channel)
        grpc_type = {"int8": pb.EMBEDDING_TYPE_INT8, "uint8": pb.EMBEDDING_TYPE_UINT8,
                     "binary": pb.EMBEDDING_TYPE_BINARY, "ubinary": pb.EMBEDDING_TYPE_UBINARY}
        request = pb.EmbedRequest(inputs=[pb.Input(text=TEXT)])
        sizes["gRPC Embed"] = {"float": stub.Embed(request).ByteSize()}
        for kind in TYPES:
            sizes["gRPC Embed"][kind] = stub.Embed(
                pb.EmbedRequest(inputs=[pb.Input(text=TEXT)], embedding_type=grpc_type[kind])).ByteSize()
    cohere = f"{server.http_url}/v2/embed"
    sizes["Cohere /v2/embed"] = {"float": len(post(cohere, {"model": model, "texts": [TEXT],
                                                            "embedding_types": ["base64"]}))}
    for kind in TYPES:
        sizes["Cohere /v2/embed"][kind] = len(post(cohere, {"model": model, "texts": [TEXT],
                                                            "embedding_types": [kind]}))
    sizes["TEI /embed"] = {"float": len(post(f"{server.http_url}/embed", {"inputs": [TEXT]}))}
    for kind in TYPES:
        sizes["TEI /embed"][kind] = len(post(f"{server.http_url}/embed", {"inputs": [TEXT], "embedding_type": kind}))
    sizes["KServe v2 infer (binary tensors)"] = {"float": kserve(server, model, None)}
    for kind in TYPES:
        sizes["KServe v2 infer (binary tensors)"][kind] = kserve(server, model, kind)
    sizes["OpenAI /v1/embeddings"] = {"float": len(post(f"{server.http_url}/v1/embeddings", {
        "input": [TEXT], "model": model, "encoding_format": "base64"}))}
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", help="artifact directory (default: the default model's)")
    args = parser.parse_args(argv)
    artifacts = resolve_artifacts(args.artifacts)
    manifest = json.loads((Path(artifacts) / "manifest.json").read_text(encoding="utf-8"))
    model, size = manifest["model"], int(manifest["embedding_size"])
    server = ServerProcess(artifacts)
    try:
        server.wait_serving()
        sizes = measure(server, model)
    finally:
        server.terminate()
    print(f"reply bytes for one {size}-d vector of {model}, one {len(TEXT)}-character text; ratio to the door's "
          "float reply (base64 where the door has it)")
    print(f"codes alone: float32 {4 * size} bytes, int8/uint8 {size} ({size / (4 * size):.3f}), binary/ubinary "
          f"{(size + 7) // 8} ({(size + 7) // 8 / (4 * size):.4f})")
    header = f"{'door':34} {'float':>6} " + " ".join(f"{k:>15}" for k in TYPES)
    print(header)
    for door, row in sizes.items():
        cells = " ".join(f"{row[k]:>6} ({row[k] / row['float']:.3f})" if k in row else f"{'-':>15}" for k in TYPES)
        print(f"{door:34} {row['float']:>6} {cells}")
    openai_float = sizes["OpenAI /v1/embeddings"]["float"]
    best = min(row["ubinary"] for row in sizes.values() if "ubinary" in row)
    ratio = best / openai_float
    print(f"smallest ubinary reply / OpenAI's float base64 reply: {best} / {openai_float} = {ratio:.3f}")
    line, _ = target_line(TARGETS, "ubinary / float base64 reply", "ubinary_over_float_base64", ratio,
                          f"{ratio:.3f}")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
