"""A small synchronous Python client for attnserve.v1.Encoder that returns numpy arrays.

    from attnserve.client import Client

    with Client("localhost:50051") as client:
        vectors = client.embed(["a sentence", "another one"])        # (2, 384) float32
        result = client.attention("The cat sat.", layers=[-1])        # .attentions (1, 12, T, T), .tokens
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from attnserve.config import ClientConfig
from attnserve.errors import AttnserveError, ConfigError, Reason
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

from .auth import AioApiKeyInterceptor, ApiKeyInterceptor
from .reach import why_no_grpc
from .status import ErrorDetails, error_details

DTYPES: dict[int, np.dtype] = {pb.FLOAT32: np.dtype("<f4"), pb.FLOAT16: np.dtype("<f2")}
POOLING = {None: pb.POOLING_DEFAULT, "default": pb.POOLING_DEFAULT, "mean": pb.MEAN, "cls": pb.CLS}
TRUNCATION_DIRECTION = {"right": pb.TRUNCATE_RIGHT, "left": pb.TRUNCATE_LEFT}

@dataclass(frozen=True)
class ImageInput:
    """An image for an image-text model (CLIP, SigLIP): its file's bytes (PNG, JPEG, WebP, ...), or an http(s) URL
    the server is allowed to fetch. ImageInput.read(path) reads a file."""

    data: bytes = b""
    url: str = ""
    mime_type: str = ""  # what the bytes are, if the caller knows: the server holds the bytes to it

    @classmethod
    def read(cls, path: str | Path) -> ImageInput:
        try:
            return cls(Path(path).read_bytes())
        except OSError as e:
            raise ConfigError(f"image unreadable: {path}: {e.strerror}") from None


# A text, token ids with special tokens included, a sentence pair (text a, text b) as a tuple, or an image.
Input = str | Sequence[int] | tuple[str, str] | ImageInput


@dataclass(frozen=True)
class PatchPositions:
    """Where an image's positions (the maps' axes) lie in the height x width image its tower takes (square for
    CLIP and SigLIP; SigLIP 2's NaFlex keeps each picture's aspect ratio)."""

    image_size: int  # a square image's side; 0 where it is not square
    patch_size: int
    grid: int  # patches along a side of a square image; 0 where it is not square
    class_token: bool  # the first position is the class token (CLIP), whose box is the whole image
    boxes: np.ndarray  # (T, 4) int: each position's top, left, bottom, right
    # How the picture became that image: "crop" (CLIP's), "stretch" (SigLIP's) or "patches" (NaFlex's: resized to
    # whole patches, its aspect ratio kept as near as they allow).
    fit: str = "crop"
    height: int = 0  # px; 0 (unset) only where built by hand with a square's fields alone
    width: int = 0
    rows: int = 0  # the patches: rows x cols in row-major order
    cols: int = 0

    def __post_init__(self):
        # A square's fields alone (an older server's reply, or built by hand) imply the rest.
        if not self.rows:
            object.__setattr__(self, "rows", self.grid)
            object.__setattr__(self, "cols", self.grid)
        if not self.height:
            object.__setattr__(self, "height", self.image_size)
            object.__setattr__(self, "width", self.image_size)

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols): the maps' patches as a grid (attnserve/patch_attention.py's shape)."""
        return self.rows, self.cols


class RequestError(AttnserveError):
    """The server answered with an error status: error_details holds its code, message and the structured
    details the server attached (client/status.py: reason, the refused field and input, retry delay)."""

    def __init__(self, error_details: ErrorDetails, explanation: str | None = None):
        """explanation: what the failure means, where the client could tell (client/reach.py), instead of the
        status's own message."""
        super().__init__(explanation or f"{error_details.code.name}: {error_details.message}")
        self.error_details = error_details
        self.code, self.details = error_details.code, error_details.message

    @classmethod
    def from_rpc(cls, error: grpc.RpcError, target: str | None = None) -> RequestError:
        """target: where the call went; a failure with no answer from a server is then explained (nothing listens
        there, or an HTTP server does)."""
        details = error_details(error)
        unanswered = details.code == grpc.StatusCode.UNAVAILABLE and details.reason is None
        return cls(details, why_no_grpc(target) if target and unanswered else None)


@dataclass
class EmbeddingResult:
    sentence_embedding: np.ndarray  # (H,)
    num_tokens: int
    truncated: bool
    tokens: list[str]  # word pieces, when token embeddings or attention were asked for
    token_embeddings: np.ndarray | None = None  # (T, H)
    attentions: np.ndarray | None = None  # (layers, heads or 1, T, T)
    pair_start: int | None = None  # for a pair: the index of the first token of segment b
    rollout: np.ndarray | None = None  # (T, T) attention rollout, when asked (analyses)
    head_stats: dict[str, np.ndarray] | None = None  # statistic -> (layers, heads), when asked (analyses)
    norms: np.ndarray | None = None  # (layers, heads, T, T) norm-weighted attention, when asked (analyses)
    norms_summed: np.ndarray | None = None  # (layers, T, T) summed over each layer's heads, with norms
    # What Client.attention asked for, which the reply does not say: its layers (as given) and whether the heads
    # were averaged. to_html needs them to label the maps.
    attention_layers: tuple[int, ...] | None = None
    average_heads: bool = False
    patches: PatchPositions | None = None  # an image's, with attention: where its positions lie

    def to_html(self, path: str | Path, model: str = "", text: str = "") -> Path:
        """Write the attention explorer with this result embedded (attnserve/explorer_page.py), a page that opens from
        disk with no server. The result must hold every layer's every head, in order: ask
        client.attention(text, layers=range(num_layers)); its analyses are shown where present."""
        from attnserve.explorer_page import standalone_html

        if self.attentions is None:
            raise AttnserveError("to_html needs the attention weights: ask for them (weights true)")
        if self.average_heads:
            raise AttnserveError("to_html needs every head's map: ask without average_heads")
        if self.attention_layers is None or list(self.attention_layers) != list(range(len(self.attentions))):
            raise AttnserveError("to_html needs every layer from the first, in order: ask "
                                 "client.attention(text, layers=range(num_layers))")
        item: dict = {"index": 0, "tokens": self.tokens, "num_tokens": self.num_tokens, "truncated": self.truncated,
                      "layers": list(range(self.attentions.shape[0])), "heads": list(range(self.attentions.shape[1])),
                      "shape": list(self.attentions.shape), "attentions": self.attentions}
        if self.pair_start is not None:
            item["pair_start"] = self.pair_start
        for name in ("rollout", "norms", "norms_summed"):
            if getattr(self, name) is not None:
                item[name] = getattr(self, name)
        if self.head_stats is not None:
            item["head_stats"] = self.head_stats
        try:
            page = standalone_html({"object": "list", "model": model, "data": [item], "text": text})
        except ValueError as e:
            raise AttnserveError(f"to_html: {e}") from None
        path = Path(path)
        path.write_text(page, encoding="utf-8")
        return path


@dataclass(frozen=True)
class RerankResult:
    index: int  # the text's position in the request
    score: float
    text: str | None = None  # when return_text


def to_array(tensor: pb.Tensor) -> np.ndarray:
    if tensor.dtype not in DTYPES:
        raise AttnserveError(f"unknown tensor dtype {tensor.dtype} in the reply")
    dtype = DTYPES[tensor.dtype]
    shape = tuple(tensor.shape)
    if len(tensor.data) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise AttnserveError(f"reply tensor of shape {shape} carries {len(tensor.data)} bytes")
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape)


def to_patches(patches: pb.PatchPositions) -> PatchPositions:
    """rows 0: an older server's reply, whose image is square: PatchPositions fills them from grid, image_size."""
    return PatchPositions(patches.image_size, patches.patch_size, patches.grid, patches.class_token,
                          np.array(patches.boxes, dtype=np.int64).reshape(-1, 4), patches.fit or "crop",
                          patches.height, patches.width, patches.rows, patches.cols)


def to_result(embedding: pb.Embedding) -> EmbeddingResult:
    return EmbeddingResult(
        # A reranker's attention reply has none: an empty vector.
        sentence_embedding=to_array(embedding.sentence_embedding) if embedding.HasField("sentence_embedding")
        else np.zeros(0, np.float32),
        num_tokens=embedding.num_tokens,
        truncated=embedding.truncated,
        tokens=list(embedding.tokens),
        token_embeddings=to_array(embedding.token_embeddings) if embedding.HasField("token_embeddings") else None,
        attentions=to_array(embedding.attentions) if embedding.HasField("attentions") else None,
        pair_start=embedding.pair_start if embedding.HasField("pair_start") else None,
        rollout=to_array(embedding.analyses.rollout) if embedding.analyses.HasField("rollout") else None,
        head_stats={name: to_array(t) for name, t in embedding.analyses.head_stats.items()}
        if embedding.analyses.head_stats else None,
        norms=to_array(embedding.analyses.norms) if embedding.analyses.HasField("norms") else None,
        norms_summed=to_array(embedding.analyses.norms_summed) if embedding.analyses.HasField("norms_summed")
        else None,
        patches=to_patches(embedding.patches) if embedding.HasField("patches") else None,
    )


def make_request(inputs: Sequence[Input], *, normalize: bool | None = None, pooling: str | None = None,
                 truncate: bool | None = None, truncation_direction: str = "right", dimensions: int | None = None,
                 token_embeddings: bool = False, attention_layers: Sequence[int] | None = None,
                 attention_heads: Sequence[int] = (), average_heads: bool = False, model: str | None = None,
                 prompt_name: str | None = None, prompt: str | None = None, analyses: Sequence[str] = (),
                 weights: bool = True) -> pb.EmbedRequest:
    """attention_layers None: no attention weights; [] : the last layer; negative indices count from the end.
    truncate: True cuts inputs longer than max_seq_length, False has them refused; None leaves it to the server
    (its --long-inputs: cut, by default). attention_heads: () every head. dimensions: keep the first N of the
    sentence embedding, then normalise.
    model None: the server's default model. prompt_name / prompt: a prompt of the model's, or a raw one, before
    each text (both None: the model's default prompt, if it has one). analyses: attention analyses computed by the
    server ("rollout", "head_stats", "norms"; with attention_layers); weights False: those alone, without the
    weights."""
    if isinstance(inputs, str):
        raise TypeError("inputs must be a list of texts (or token id lists), not a single string")
    if pooling not in POOLING:
        raise ConfigError(f"pooling {pooling!r} is not one of default, mean, cls")
    if truncation_direction not in TRUNCATION_DIRECTION:
        raise ConfigError(f"truncation_direction {truncation_direction!r} is not one of right, left")
    request = pb.EmbedRequest(pooling=POOLING[pooling], return_token_embeddings=token_embeddings,
                              truncation_direction=TRUNCATION_DIRECTION[truncation_direction], model=model or "")
    if truncate is not None:  # unset on the wire: the server's default
        request.truncate = truncate
    if prompt_name is not None:
        request.prompt_name = prompt_name
    if prompt is not None:
        request.prompt = prompt
    if normalize is not None:
        request.normalize = normalize
    if dimensions is not None:
        request.dimensions = dimensions
    for item in inputs:
        if isinstance(item, str):
            request.inputs.add(text=item)
        elif isinstance(item, tuple):
            text_a, text_b = item
            request.inputs.add(pair=pb.TextPair(a=text_a, b=text_b))
        elif isinstance(item, ImageInput):
            image = pb.Image(url=item.url) if item.url else pb.Image(data=item.data)
            image.mime_type = item.mime_type
            request.inputs.add(image=image)
        else:
            request.inputs.add(token_ids=pb.TokenIds(ids=[int(i) for i in item]))
    if attention_layers is not None:
        request.attention.SetInParent()
        request.attention.layers.extend(attention_layers)
        request.attention.heads.extend(attention_heads)
        request.attention.average_heads = average_heads
        request.attention.analyses.extend(analyses)
        if not weights:
            request.attention.weights = False
    elif analyses or not weights:
        raise ConfigError("analyses and weights go with attention: pass attention_layers ([] for the last layer)")
    return request


def channel_credentials(config: ClientConfig) -> grpc.ChannelCredentials | None:
    if not (config.tls or config.tls_ca or config.tls_cert):
        return None
    try:
        ca = Path(config.tls_ca).read_bytes() if config.tls_ca else None
        key = Path(config.tls_key).read_bytes() if config.tls_key else None
        cert = Path(config.tls_cert).read_bytes() if config.tls_cert else None
    except OSError as e:
        raise ConfigError(f"TLS file unreadable: {e.filename}: {e.strerror}") from None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


# The server bounds its replies (max_response_bytes); the client takes whatever it is sent.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def service_config(lb_policy: str, health_checked: bool) -> str:
    """gRPC's service config: the balancing policy and, for round_robin, client-side health checking.

    With health checking, the channel watches each address's grpc.health.v1 status and sends calls only to
    replicas that say SERVING: a replica that starts draining (NOT_SERVING) stops getting calls at once,
    instead of refusing them with UNAVAILABLE until its connection closes, and a replica still warming up
    gets none. (Measured with two replicas under 64 streams, one stopped: 1,444-1,693 UNAVAILABLE replies
    and occasional CANCELLED at grpc's final stop before; 0-1 after.) A server without the health service
    answers UNIMPLEMENTED, which gRPC takes as healthy.
    """
    config: dict = {"loadBalancingConfig": [{lb_policy: {}}]}
    if health_checked and lb_policy == "round_robin":  # gRPC checks health under round_robin only
        config["healthCheckConfig"] = {"serviceName": ""}
    return json.dumps(config)


def open_channel(config: ClientConfig, aio: bool = False, health_checked: bool = True
                 ) -> grpc.Channel | grpc.aio.Channel:
    """The one way attnserve's clients connect: TLS as configured, calls spread by config.lb_policy, the API key
    (config.api_key) on every call.

    health_checked False: every address gets calls whatever its health says, for the calls that ask it.
    """
    credentials = channel_credentials(config)
    options = [*CHANNEL_OPTIONS, ("grpc.service_config", service_config(config.lb_policy, health_checked))]
    if aio:
        interceptors = [AioApiKeyInterceptor(config.api_key)] if config.api_key else None
        return (grpc.aio.secure_channel(config.target, credentials, options, interceptors=interceptors)
                if credentials else grpc.aio.insecure_channel(config.target, options, interceptors=interceptors))
    channel = (grpc.secure_channel(config.target, credentials, options) if credentials
               else grpc.insecure_channel(config.target, options))
    return grpc.intercept_channel(channel, ApiKeyInterceptor(config.api_key)) if config.api_key else channel


class Client:
    def __init__(self, target: str | None = None, config: ClientConfig | None = None, api_key: str | None = None,
                 model: str | None = None):
        """api_key: the server's key (default: config.api_key, from ATTNSERVE_API_KEY in the CLI). model: the
        served model every call asks for unless it names another (None: the server's default model)."""
        self.model = model
        self.config = config or ClientConfig()
        if target:
            self.config.target = target
        if api_key:
            self.config.api_key = api_key
        self._channel = open_channel(self.config)
        self._stub = encoder_pb2_grpc.EncoderStub(self._channel)

    def embed(self, inputs: Sequence[Input], *, normalize: bool | None = None, pooling: str | None = None,
              truncate: bool | None = None, dimensions: int | None = None, timeout: float | None = None, **options
              ) -> np.ndarray:
        """Sentence embeddings, (N, H or dimensions) float32, in input order. normalize None: as the model does.
        options: model, prompt_name, prompt, as make_request takes them."""
        reply = self._call(self._stub.Embed, self._request(inputs, normalize=normalize, pooling=pooling,
                                                           truncate=truncate, dimensions=dimensions, **options),
                           timeout)
        return np.stack([to_array(e.sentence_embedding) for e in reply.embeddings])

    def encode(self, inputs: Sequence[Input], timeout: float | None = None, **options) -> list[EmbeddingResult]:
        """Everything the server returns per input; options as make_request takes them."""
        reply = self._call(self._stub.Embed, self._request(inputs, **options), timeout)
        return [to_result(e) for e in reply.embeddings]

    def _request(self, inputs: Sequence[Input], **options) -> pb.EmbedRequest:
        options.setdefault("model", self.model)
        return make_request(inputs, **options)

    def attention(self, text: Input, layers: Sequence[int] = (), *, average_heads: bool = False,
                  truncate: bool | None = None, timeout: float | None = None, analyses: Sequence[str] = (),
                  weights: bool = True) -> EmbeddingResult:
        """Attention weights of one input: .attentions (layers, heads or 1, T, T), labelled by .tokens; with
        analyses, .rollout (T, T) and .head_stats {name: (layers, heads)} as numpy arrays (weights False: those
        alone). An image (ImageInput) gets its image tower's maps over the patches, and .patches says where each
        position lies."""
        asked = tuple(layers)  # read once: any iterable of layers
        result = self.encode([text], timeout, attention_layers=list(asked), average_heads=average_heads,
                             truncate=truncate, analyses=analyses, weights=weights)[0]
        result = dataclasses.replace(result, attention_layers=asked, average_heads=average_heads)
        if weights and result.attentions is None:  # a reply without them (from another server) is no answer
            raise AttnserveError("the server's reply carries no attention weights")
        return result

    def embed_stream(self, batches: Iterable[Sequence[Input]], *, timeout: float | None = None, **options
                     ) -> Iterator[np.ndarray]:
        """One (n, H) array per batch, in order, over one EmbedStream call; batches in flight are pipelined."""
        requests = (self._request(batch, **options) for batch in batches)
        try:
            for reply in self._stub.EmbedStream(requests, timeout=timeout or self.config.timeout):
                yield np.stack([to_array(e.sentence_embedding) for e in reply.embeddings])
        except grpc.RpcError as e:
            raise RequestError.from_rpc(e, self.config.target) from None

    def rerank(self, query: str, texts: Sequence[str], *, top_n: int | None = None, raw_scores: bool = False,
               return_text: bool = False, truncate: bool | None = None, model: str | None = None,
               timeout: float | None = None) -> list[RerankResult]:
        """Each text scored against the query by the server's reranker, best first (top_n of them)."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of texts, not a single string")
        request = pb.RerankRequest(query=query, texts=list(texts), raw_scores=raw_scores, return_text=return_text,
                                   model=model or "")
        if truncate is not None:  # None: the server's default
            request.truncate = truncate
        if top_n is not None:
            request.top_n = top_n
        reply = self._call(self._stub.Rerank, request, timeout)
        return [RerankResult(r.index, r.score, r.text if r.HasField("text") else None) for r in reply.results]

    def model_info(self, model: str | None = None, timeout: float | None = None) -> pb.ModelInfo:
        """One served model's description (model None: this client's model, else the server's default)."""
        return self._call(self._stub.GetModelInfo, pb.GetModelInfoRequest(model=model or self.model or ""), timeout)

    def list_models(self, timeout: float | None = None) -> list[pb.ModelInfo]:
        """Every model the server serves, the default first."""
        return list(self._call(self._stub.ListModels, pb.ListModelsRequest(), timeout).models)

    def _call(self, method, request, timeout: float | None):
        """One call; while the server builds a graph the call needs (GRAPH_BUILDING: its model's first attention
        request), retried after the delay the server names, for up to build_wait seconds in all."""
        waited_until = time.monotonic() + self.config.build_wait
        while True:
            try:
                return method(request, timeout=timeout or self.config.timeout)
            except grpc.RpcError as e:
                error = RequestError.from_rpc(e, self.config.target)
            delay = error.error_details.retry_delay
            if error.error_details.reason != Reason.GRAPH_BUILDING or delay is None or \
                    time.monotonic() + delay > waited_until:
                raise error from None
            time.sleep(delay)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
