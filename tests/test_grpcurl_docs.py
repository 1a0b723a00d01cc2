"""The grpcurl example of docs/grpc.md and its snippet that decodes the reply, against a real server.

grpcurl is a Go binary this machine does not have; what it sends and prints is protobuf's JSON mapping of the
messages, which google.protobuf.json_format implements too: the page's request JSON is sent to a real server, the
reply printed as that JSON, and the page's Python snippet run on it, unchanged.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
from google.protobuf import json_format

from attnserve.client.client import to_result
from attnserve.v1 import encoder_pb2 as pb

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "grpc.md").read_text()


def test_the_grpc_pages_snippet_decodes_a_grpcurl_reply_into_the_servers_arrays(stub, tmp_path):
    # The -d JSON of the page's grpcurl call whose reply the snippet reads (`> reply.json`).
    command = re.search(r"^(grpcurl [^\n]*\\\n[^\n]*> reply\.json)$", PAGE, re.MULTILINE).group(1)
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:2] == ["grpcurl", "-plaintext"] and argv[-3:] == ["attnserve.v1.Encoder/Embed", ">", "reply.json"]
    snippet = re.search(r"^python - <<'EOF'\n(.*?)^EOF$", PAGE, re.MULTILINE | re.DOTALL).group(1)
    reply = stub.Embed(json_format.Parse(argv[argv.index("-d") + 1], pb.EmbedRequest()), timeout=60)
    (tmp_path / "reply.json").write_text(json_format.MessageToJson(reply))
    # As a user runs it: `python -` in the folder with reply.json.
    done = subprocess.run([sys.executable, "-"], input=snippet, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    expected = to_result(reply.embeddings[0])
    assert done.stdout.startswith(f"{expected.sentence_embedding.shape} {expected.attentions.shape} ")
    # And its function, on the same JSON, gives the client's arrays exactly.
    namespace: dict = {}
    exec(compile(snippet.split("embedding = json.load")[0], "docs/grpc.md", "exec"), namespace)
    embedding = json_format.MessageToDict(reply)["embeddings"][0]
    np.testing.assert_array_equal(namespace["tensor"](embedding["sentenceEmbedding"]), expected.sentence_embedding)
    np.testing.assert_array_equal(namespace["tensor"](embedding["attentions"]), expected.attentions)
    assert embedding["tokens"] == list(expected.tokens) == ["[CLS]", "hello", "[SEP]"]
