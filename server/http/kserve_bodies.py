"""KServe v2 (the Open Inference Protocol, as Triton speaks it) over HTTP: its inference body, tensors and reply,
the repository index and its error body, as pydantic models (bodies.py)."""

from __future__ import annotations

from typing import Union

from pydantic import BaseModel, ConfigDict, Field

from .bodies import MODEL_MARK, LenientBody

# A tensor's data in JSON: row-major, flat or nested as its shape (KServe allows both).
TensorData = list[Union[str, int, float, bool, list]]
# Request and tensor parameters: KServe's values are strings, numbers and booleans. Unknown ones are ignored, as
# Triton ignores those it does not know (its clients send some, such as binary_data_output).
Parameters = dict[str, Union[str, int, float, bool]]


class KServeTensor(LenientBody):
    name: str
    shape: list[int] = Field(description="the tensor's shape; the number of elements is its product")
    datatype: str = Field(description="BYTES for texts")
    parameters: Parameters | None = Field(None, description="binary_data_size: the tensor's bytes follow the JSON "
                                                            "(Triton's binary tensor extension)")
    data: TensorData | None = Field(None, description="the elements, row-major; absent when binary_data_size is set")


class KServeRequestedOutput(LenientBody):
    name: str = Field(description="one of the model's outputs (its metadata lists them)")
    parameters: Parameters | None = Field(None, description="binary_data: true sends the tensor as bytes after "
                                                            "the JSON")


class KServeInferBody(LenientBody):
    # The described body is the default model's (openapi.py: its inputs' and outputs' names, its parameters).
    model_config = ConfigDict(json_schema_extra={MODEL_MARK: "kserve_infer"})
    id: str | None = None
    parameters: Parameters | None = Field(None, description="truncate (a boolean; unset: as the server's "
                                                            "--long-inputs says), normalize (a boolean), "
                                                            "dimensions (an integer), prompt_name, task, "
                                                            "embedding_type, input_type (strings), raw_scores (a "
                                                            "boolean, a reranker's), binary_data_output (a boolean)")
    inputs: list[KServeTensor] = Field(description="BYTES tensors: `text`, the texts, shape [N] or [N, 1]; a "
                                                   "reranker's `query` [1] and `text`, its documents")
    outputs: list[KServeRequestedOutput] | None = Field(None, description="unset: the model's usual outputs (all "
                                                                          "but token_embeddings, which is sent when "
                                                                          "named)")


class KServeRepositoryIndexBody(LenientBody):
    repository_name: str | None = None
    ready: bool | None = Field(None, description="every served model is ready once the server is")


class KServeOutputTensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: list[float] | list[int] | None = None


class KServeInferReply(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[KServeOutputTensor]


class KServeError(BaseModel):
    error: str
