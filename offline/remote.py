"""`attnserve encode --server HOST:PORT`: the chunk encoder that sends the work to a running attnserve server.

The model is not loaded here. The job driver (offline/job.py) reads and checks the input
and hands over chunks; each chunk's good rows are sorted by estimated length and cut into
requests of up to REQUEST_INPUTS inputs, which go out pipelined over ONE EmbedStream call, so
the server's batcher sees many requests at once and batches inputs of similar length across
them. The requests in flight are bounded (in number and in estimated tokens), so a large
file never sits in memory or in the server's queue. Replies come back in request order; a
chunk is put back in input order and handed back once its last reply is in.

The server's refusals are read from the structured details it attaches to every error
(client/status.py), never from its message text: an INVALID_INPUT names the request of the
stream and the input, which is turned back into the file's line (and stops the run, or is set
aside with --on-error skip); QUEUE_FULL is retried from the first unanswered request on a new
stream, with backoff; anything else (MESSAGE_TOO_LARGE, unreachable, SHUTTING_DOWN, no reply
within the client timeout) stops the run with one line, and the same command resumes after
the chunks already written.

Images go as their files' bytes (Input.image), decoded by the server within its own pixel
limit; an image it refuses (corrupt, SVG, too many pixels) is an INVALID_INPUT like any
other, and so a bad row.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace

import grpc
import numpy as np

from attnserve.client.client import open_channel
from attnserve.client.reach import why_no_grpc
from attnserve.client.retry import Backoff
from attnserve.client.status import ErrorDetails, error_details
from attnserve.config import ClientConfig
from attnserve.engine.batch_outputs import object_array
from attnserve.engine.engine import EncodeStats
from attnserve.engine.output_options import OutputOptions
from attnserve.engine.outputs import chunk_vectors, sentence_outputs
from attnserve.errors import AttnserveError
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

from .job import Chunk, EncodedChunk, EncodeJob, EncodeResult, ImageFacts, ModelFacts, Session, run_job
from .readers import Record

# Inputs per request, and estimated tokens per request: a request ends at whichever comes first, so
# requests of long texts stay small and replies keep flowing. Measured against a local `attnserve serve`
# on the mixed-length corpus of loadtest/corpus.py (2-core CPU shared with other work, so wall-clock rates
# were noisy): 16, 64 and 128 inputs per request, and windows of 8, 32 and 64 requests, all gave the
# same server padding (2.0-2.5%) and the same tokens per CPU-second (~3,000-3,200) within noise; the
# client itself used under 1% of the CPU time. 64 keeps per-message overhead low without making a
# resent request large.
REQUEST_INPUTS = 64
REQUEST_TOKENS = 4096
# In flight at once on the stream: at most WINDOW_REQUESTS requests (the server reads up to 64 of one
# stream ahead) and at most 1/WINDOW_QUEUE_SHARE of the server's queue (max_queue_tokens, 65536 by
# default) in estimated tokens: several full batches (max_batch_tokens, 2048) waiting behind the one
# running, and room left in a shared server's queue for other clients.
WINDOW_REQUESTS = 32
WINDOW_QUEUE_SHARE = 4
# Each chunk's rows go out sorted by estimated length (stable: equal estimates keep input order), so the
# inputs queued on the server at any moment are of similar length and its batches carry little padding:
# measured, 2.2-2.5% padded cells sorted against 4.2-4.7% in input order (the server sorts only the
# 256 oldest inputs it holds).
SORT_BY_LENGTH = True
# What an image costs the server's queue, estimated: the positions of the largest common tower (ViT-L/14 at 336 px:
# 24 x 24 patches and the class token). The server counts an image as its tower's positions, which ModelInfo does not
# say; erring high keeps the window within the share of the queue it means to take.
IMAGE_TOKENS = 577
# QUEUE_FULL is the server's "retry later": other clients are filling its queue. The server ends the
# stream at the request it could not queue; the replies before it are good and the requests after it
# were dropped unanswered. So we reopen the stream and resend from the first unanswered request, in
# order -- no row is lost or answered twice -- after a backoff of 0.5, 1, 2, 4, 8 s (with jitter; longer
# if the server's RetryInfo asks for it), halving our own window each time (it grows back as replies
# arrive). The count starts over whenever a reply arrives; after RETRIES failures in a row we give up.
# The backoff is the clients' one (client/retry.py), with a job's waits: longer, the server's wait in full.
RETRIES = 5
BACKOFF_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0
# A request's bytes are kept under this share of the server's max_request_bytes (room for framing); a
# larger message is refused (MESSAGE_TOO_LARGE), which no retry would fix.
REQUEST_BYTES_SHARE = 0.5

log = logging.getLogger("attnserve.offline.remote")

_END = object()


def embedding_size(info: pb.ModelInfo) -> int:
    """The size of the server's sentence embeddings; a server older than the field sends 0: its hidden size."""
    return info.embedding_size or info.hidden_size


def estimate_tokens(record: Record) -> int:
    """Tokens a row takes before truncation, without the tokenizer: ~1 per 3 characters, plus 2 special.

    English word pieces average over 4 characters, so this errs high for the window's budget; CJK text and
    punctuation runs come closer to 1 per character, which the server's own queue limit then catches.
    """
    if record.image is not None:
        return IMAGE_TOKENS
    item = record.input
    return 2 + len(item) // 3 if isinstance(item, str) else len(item)


def _left_to_do(session: Session, multi_vector: bool) -> OutputOptions | None:
    """The outputs' assembly left once the server answered (engine/outputs.py, as a local run's): its float vectors
    cut to the run's dimensions (then normalised), or a late-chunked text's chunk means cut and normalised (the
    server sends them as they are: _new_message), and typed as the run asks. None: a ColBERT or SPLADE model's
    outputs, written as the server sent them."""
    options = session.options
    if multi_vector or options.sparse is not None:
        return None
    if session.late is not None:
        return options
    return replace(options, normalize=options.normalize and options.dimensions is not None)


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(eq=False)
class _Pending:
    """One chunk on its way: its good rows' outputs, filled as replies arrive, and the rows refused."""

    chunk: Chunk
    embeddings: np.ndarray  # (n, H)
    num_tokens: np.ndarray  # (n,)
    truncated: np.ndarray  # (n,)
    left: int  # good rows neither answered nor refused yet
    refused: dict[int, str] = field(default_factory=dict)  # position in chunk.records -> reason
    stats: EncodeStats = field(default_factory=EncodeStats)
    chunks: np.ndarray | None = None  # late chunking's: (n,) of (k_i, 3) start, stop, tokens (embeddings (k_i, H))
    sparse: np.ndarray | None = None  # bge-m3's, where asked: (n,) of (indices, values)
    multi_vector: np.ndarray | None = None  # bge-m3's, where asked: (n,) of (T_i - 1, d)
    # What is left to do of the run's outputs once the server answered (_left_to_do); None: nothing.
    finish: OutputOptions | None = None

    def encoded(self) -> EncodedChunk:
        keep = np.ones(len(self.chunk.records), bool)
        keep[list(self.refused)] = False
        embeddings, finish = self.embeddings[keep], self.finish
        if finish is not None and self.chunks is not None:  # late chunks' means: (k_i, H) -> (k_i, D) each
            embeddings = object_array([chunk_vectors(e, finish) for e in embeddings])
        elif finish is not None:  # (n, H) -> (n, D), typed
            embeddings = sentence_outputs(embeddings, finish)[1][finish.embedding_types[0]]
        return EncodedChunk(self.chunk, embeddings, self.num_tokens[keep], self.truncated[keep],
                            self.stats, self.refused, *(None if a is None else a[keep]
                                                         for a in (self.chunks, self.sparse, self.multi_vector)))


@dataclass(eq=False)
class _Request:
    pending: _Pending
    rows: list[int]  # positions in chunk.records, in the request's input order
    tokens: int  # estimated, after truncation: what the request costs the server's queue
    message: pb.EmbedRequest = field(repr=False)


class _Stream:
    """One EmbedStream call: send() never blocks; receive() waits at most `timeout` for the next reply.

    There is no deadline on the call itself, since an encode job may run for hours; instead receive()
    gives up when no reply comes for `timeout` seconds while requests are in flight.
    """

    def __init__(self, stub: encoder_pb2_grpc.EncoderStub):
        self._outgoing: queue.SimpleQueue = queue.SimpleQueue()
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()
        # grpc consumes the request iterator in a thread of its own; it blocks until send() or close.
        self._call = stub.EmbedStream(iter(self._outgoing.get, _END))
        self._reader = threading.Thread(target=self._read, name="attnserve-encode-replies", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self._incoming.put(reply)
            self._incoming.put(_END)
        except BaseException as error:  # grpc.RpcError, or anything else: receive() raises it
            self._incoming.put(error)

    def send(self, message: pb.EmbedRequest) -> None:
        self._outgoing.put(message)

    def close_sending(self) -> None:
        self._outgoing.put(_END)

    def receive(self, timeout: float) -> pb.EmbedResponse | None:
        """The next reply; None once the server ended the stream. Raises the call's grpc.RpcError."""
        try:
            item = self._incoming.get(timeout=timeout)
        except queue.Empty:
            self.cancel()
            raise TimeoutError from None
        if item is _END:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self._call.cancel()
        self._outgoing.put(_END)


@dataclass(eq=False)
class _Flow:
    """One run's requests on their way: the stream they go on, what is read, sent and answered, and the window."""

    stream: _Stream
    window: int  # estimated tokens in flight at most: halved by each QUEUE_FULL, grown back by replies
    full_window: int
    waiting: deque[_Pending] = field(default_factory=deque)  # read and not yet handed back, in input order
    # Their rows: bounded to about two chunks and a window, so the next chunk's requests follow the last
    # ones of this chunk without a pause, and rows of chunks without good rows cannot pile up.
    waiting_rows: int = 0
    chunk_rows: int = 0
    unsent: deque[_Request] = field(default_factory=deque)  # to send (again) first, after the server ended a stream
    pending: deque[_Request] = field(default_factory=deque)  # sent on the current stream and unanswered, in order
    in_flight: int = 0  # estimated tokens of pending
    exhausted: bool = False  # every chunk read
    failures: int = 0  # QUEUE_FULL in a row
    sending: bool = True
    answered: int = 0  # replies on this stream


class ServerEncoder:
    def __init__(self, config: ClientConfig, model: str | None = None):
        """model: the served model to use (None: the server's default)."""
        self.config, self.target, self.model = config, config.target, model
        self.channel = open_channel(config)
        self.stub = encoder_pb2_grpc.EncoderStub(self.channel)
        self._info: pb.ModelInfo | None = None

    def close(self) -> None:
        self.channel.close()

    @property
    def info(self) -> pb.ModelInfo:
        if self._info is None:
            try:
                self._info = self.stub.GetModelInfo(pb.GetModelInfoRequest(model=self.model or ""),
                                                    timeout=self.config.timeout)
            except grpc.RpcError as error:
                raise self._error(error_details(error)) from None
        return self._info

    def facts(self) -> ModelFacts:
        i = self.info
        return ModelFacts(i.model, embedding_size(i), i.vocab_size, i.max_seq_length, i.pooling, i.normalize,
                          i.precision, server=self.target, sparse=i.pooling.startswith("splade_"),
                          multi_vector=i.pooling == "multi_vector", late_chunking="late_chunking" in i.outputs,
                          # bge-m3: a dense model that also gives sparse and multi-vector embeddings
                          bge_m3_vector_size=i.multi_vector_size or None if i.pooling != "multi_vector" and
                          "embed_multi" in i.outputs and "embed_sparse" in i.outputs else None,
                          # an image-text model: its images are embedded in its texts' space, of the same size
                          images=ImageFacts(embedding_size(i)) if "embed_image" in i.outputs else None)

    # --- errors ----------------------------------------------------------------------------------------

    def _error(self, details: ErrorDetails, retries: int = 0, request: _Request | None = None) -> AttnserveError:
        """The one line that stops the run, for a status the run cannot go on after."""
        code, message, resume = details.code, _one_line(details.message), "; the same command resumes"
        rows = "" if request is None else (f" a request of {len(request.rows)} rows from "
                                          f"{request.pending.chunk.records[min(request.rows)].where} on")
        if details.reason == "SHUTTING_DOWN":
            return AttnserveError(f"server {self.target} is shutting down{resume}")
        if code == grpc.StatusCode.UNAVAILABLE:
            # No answer from attnserve (no reason): say why, as every client does (nothing listens, or HTTP does).
            explained = why_no_grpc(self.target, "--server") if details.reason is None else None
            if explained is not None:
                return AttnserveError(f"{explained}{resume}")
            return AttnserveError(f"server {self.target} is unavailable: {message}{resume}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return AttnserveError(f"server {self.target} did not answer within {self.config.timeout:g}s "
                                  f"(ATTNSERVE_TIMEOUT){resume}")
        if details.reason == "QUEUE_FULL":
            return AttnserveError(f"server {self.target} is overloaded; gave up after {retries} retries: "
                                  f"{message}{resume}")
        if details.reason == "MESSAGE_TOO_LARGE":
            return AttnserveError(f"server {self.target} refused{rows} as too large (max_request_bytes "
                                  f"{self.info.limits.max_request_bytes / 2**20:.1f} MiB): {message}")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return AttnserveError(f"server {self.target} refused{rows}: {details.description or message}")
        return AttnserveError(f"server {self.target}: {code.name}: {message}")

    @staticmethod
    def _refused_input(details: ErrorDetails, request: _Request, answered: int) -> int | None:
        """The position in `request` of the input the server refused, when the error names one of it.

        The server answers in order, so the request it refuses is the first unanswered: the
        `answered`-th of this stream."""
        if details.reason != "INVALID_INPUT" or details.input_index is None:
            return None
        if details.request_index is not None and details.request_index != answered:
            return None
        return details.input_index if details.input_index < len(request.rows) else None

    # --- the input, as requests --------------------------------------------------------------------------

    def _requests(self, chunks: Iterator[Chunk], session: Session) -> Iterator[_Pending | _Request]:
        """Each chunk as it comes, followed by its requests: good rows sorted by estimated length."""
        info, limits = self.info, self.info.limits
        max_inputs = max(1, min(REQUEST_INPUTS, limits.max_inputs_per_request or REQUEST_INPUTS))
        max_tokens = max(1, min(REQUEST_TOKENS, (limits.max_queue_tokens or 1 << 30) // WINDOW_QUEUE_SHARE))
        max_bytes = int((limits.max_request_bytes or 4 << 20) * REQUEST_BYTES_SHARE)
        for chunk in chunks:
            good, n = chunk.records, len(chunk.records)
            late = session.late is not None  # each row's chunks: (k_i, H) embeddings and (k_i, 3) spans
            embeddings = (np.empty(n, dtype=object) if info.pooling == "multi_vector" or late  # (K_i, d) each
                          else np.empty((n, embedding_size(info)), np.float32))
            pending = _Pending(chunk, embeddings, np.empty(n, np.int32), np.empty(n, bool), n,
                               finish=_left_to_do(session, info.pooling == "multi_vector"),
                               chunks=np.empty(n, dtype=object) if late else None,
                               sparse=np.empty(n, dtype=object) if "sparse_embedding" in session.outputs else None,
                               multi_vector=np.empty(n, dtype=object) if "multi_vector" in session.outputs else None)
            yield pending
            estimates = [estimate_tokens(r) for r in good]
            sizes = [_item_size(r) for r in good]
            order = [i for i in (sorted(range(n), key=estimates.__getitem__) if SORT_BY_LENGTH else range(n))
                     if not self._too_large(pending, i, sizes[i], max_bytes, session)]
            start = 0
            while start < len(order):
                request = _Request(pending, [], 0, self._new_message(session))
                size = 0
                for i in order[start:start + max_inputs]:
                    # A late-chunked text runs whole, in windows; any other is cut at max_seq_length at most; an
                    # image is never cut.
                    record, item_size = good[i], sizes[i]
                    cost = estimates[i] if late or record.image is not None else min(estimates[i],
                                                                                     info.max_seq_length)
                    if request.rows and (request.tokens + cost > max_tokens or size + item_size > max_bytes):
                        break
                    if record.text is not None:
                        request.message.inputs.add(text=record.text)
                    elif record.image is not None:
                        request.message.inputs.add(image=pb.Image(data=record.image))
                    else:
                        request.message.inputs.add(token_ids=pb.TokenIds(ids=record.token_ids))
                    request.rows.append(i)
                    request.tokens += cost
                    size += item_size
                start += len(request.rows)
                yield request

    def _too_large(self, pending: _Pending, i: int, size: int, max_bytes: int, session: Session) -> bool:
        """A row that no request could carry: refused here (the run stops, or the row is set aside)."""
        if size <= max_bytes:
            return False
        record = pending.chunk.records[i]
        limit = self.info.limits.max_request_bytes or 4 << 20
        reason = (f"{size / 2**20:.1f} MiB, too large for one request to {self.target} "
                  f"(max_request_bytes {limit / 2**20:.1f} MiB); encode it without --server")
        session.refuse(record, reason)
        pending.refused[i] = reason
        pending.left -= 1
        return True

    def _new_message(self, session: Session) -> pb.EmbedRequest:
        # Long inputs as the server's --long-inputs says, as any client's request that does not ask: by default
        # over-long inputs are cut and marked, as a local run cuts them (chunk: embedded in windows); a server
        # started with --long-inputs refuse refuses them, and each such row stops the run naming its line (or is set
        # aside with --on-error skip).
        # Normalisation as the driver settled it; the prompt is the server's to put before each text.
        if self.info.pooling == "multi_vector":  # a ColBERT model: its vectors of texts of the run's input type
            return pb.EmbedRequest(model=self.model or "", multi_vector=pb.MultiVectorOptions(
                input_type=pb.INPUT_TYPE_QUERY if session.input_type == "query" else pb.INPUT_TYPE_DOCUMENT))
        options = session.options  # full vectors normalised by the server; cut, then normalised, here
        message = pb.EmbedRequest(normalize=options.normalize and options.dimensions is None, model=self.model or "")
        if "sparse_embedding" in session.outputs:  # bge-m3's other outputs, beside its dense one: one pass
            message.sparse.SetInParent()
        if "multi_vector" in session.outputs:
            message.multi_vector.SetInParent()
        if session.late is not None:  # the chunks' means, neither cut nor normalised: the driver does both
            message.normalize = False
            message.late_chunking.chunker = session.late.chunker
            if session.late.chunker == "tokens":
                message.late_chunking.chunk_tokens = session.late.chunk_tokens
        if session.prompt.name is not None:
            message.prompt_name = session.prompt.name
        if session.prompt.text is not None:
            message.prompt = session.prompt.text
        if session.task is not None:
            message.task = session.task
        return message

    # --- the run --------------------------------------------------------------------------------------

    def encode(self, chunks: Iterator[Chunk], session: Session) -> Generator[EncodedChunk, None, None]:
        info = self.info
        items = self._requests(chunks, session)
        window = max(info.max_seq_length, (info.limits.max_queue_tokens or 65536) // WINDOW_QUEUE_SHARE)
        flow = _Flow(_Stream(self.stub), window, window)
        backoff = Backoff(BACKOFF_SECONDS, BACKOFF_MAX_SECONDS, cap_server_wait=False)
        try:
            while True:
                self._send(flow, items)
                while flow.waiting and flow.waiting[0].left == 0:
                    done = flow.waiting.popleft()
                    flow.waiting_rows -= done.chunk.rows
                    yield done.encoded()
                if not flow.pending:
                    if flow.exhausted and not flow.unsent:
                        break
                    continue
                self._receive(flow, backoff, session)
        finally:
            flow.stream.cancel()

    @staticmethod
    def _send(flow: _Flow, items: Iterator[_Pending | _Request]) -> None:
        """Send requests (those to send again first) while the window has room, reading ahead of the chunks not
        yet handed back by a bounded number of rows; once all are sent, close the stream's sending side."""
        while flow.sending and len(flow.pending) < WINDOW_REQUESTS and (not flow.pending
                                                                         or flow.in_flight < flow.window):
            if flow.unsent:
                request = flow.unsent.popleft()
            elif flow.exhausted or flow.waiting_rows >= 2 * max(flow.chunk_rows, 1) + WINDOW_REQUESTS * REQUEST_INPUTS:
                if flow.exhausted:  # all sent: the server answers what it holds, then ends the stream
                    flow.sending = False
                    flow.stream.close_sending()
                break
            else:
                item = next(items, None)
                if item is None:
                    flow.exhausted = True
                    continue
                if isinstance(item, _Pending):
                    flow.waiting.append(item)
                    flow.waiting_rows += item.chunk.rows
                    flow.chunk_rows = max(flow.chunk_rows, item.chunk.rows)
                    continue
                request = item
            flow.stream.send(request.message)
            flow.pending.append(request)
            flow.in_flight += request.tokens

    def _receive(self, flow: _Flow, backoff: Backoff, session: Session) -> None:
        """The next reply, taken into its chunk's rows; or the stream's error, after which a new stream resends
        what was unanswered (or the run stops)."""
        info = self.info
        try:
            reply = flow.stream.receive(self.config.timeout)
        except TimeoutError:
            raise AttnserveError(f"server {self.target} sent no reply for {self.config.timeout:g}s "
                                 f"(ATTNSERVE_TIMEOUT) with {len(flow.pending)} requests in flight; the same "
                                 "command resumes") from None
        except grpc.RpcError as error:
            self._failed(flow, backoff, error_details(error), session)
            return
        if reply is None:
            raise AttnserveError(f"server {self.target} ended the stream with {len(flow.pending)} requests "
                                 "unanswered; the same command resumes")
        request = flow.pending.popleft()
        flow.answered += 1
        flow.in_flight -= request.tokens
        flow.failures = 0
        backoff.reset()
        flow.window = min(flow.full_window, flow.window + info.max_seq_length)
        self._take(reply, request, embedding_size(info))
        session.on_batch(len(request.rows))

    def _failed(self, flow: _Flow, backoff: Backoff, details: ErrorDetails, session: Session) -> None:
        """The server ended the stream with an error: a refused input is set aside (or stops the run), a full queue
        is waited out (RETRIES times in a row at most), anything else stops the run; the requests unanswered go
        first on a new stream."""
        refused = self._refused_input(details, flow.pending[0], flow.answered)
        if refused is not None:
            self._set_aside(flow.pending, refused, details, session)
        elif details.reason == "QUEUE_FULL" and flow.failures < RETRIES:
            # Back off, then resend from pending[0] on.
            delay = backoff.next(details.retry_delay)
            log.info("server queue full; resending %d requests in %.2fs (retry %d of %d): %s",
                     len(flow.pending), delay, flow.failures + 1, RETRIES, _one_line(details.message))
            time.sleep(delay)
            flow.failures += 1
            flow.window = max(self.info.max_seq_length, flow.window // 2)
        else:
            raise self._error(details, flow.failures, flow.pending[0]) from None
        flow.unsent.extendleft(reversed(flow.pending))  # sent before anything in unsent: they go first
        flow.pending.clear()
        flow.in_flight = 0
        flow.stream.cancel()
        flow.stream, flow.sending, flow.answered = _Stream(self.stub), True, 0

    @staticmethod
    def _set_aside(pending: deque[_Request], i: int, details: ErrorDetails, session: Session) -> None:
        """The input the server refused: the run stops (session.refuse raises), or it leaves its request."""
        request = pending[0]
        position = request.rows[i]
        reason = _one_line(details.description or details.message)
        session.refuse(request.pending.chunk.records[position], reason)
        request.rows.pop(i)
        del request.message.inputs[i]
        request.pending.refused[position] = reason
        request.pending.left -= 1
        if not request.rows:
            pending.popleft()

    def _take_vectors(self, reply: pb.EmbedResponse, request: _Request, size: int) -> None:
        """One reply of a ColBERT model's vectors ([tokens, size] each) into its chunk's rows."""
        n, embeddings = len(request.rows), reply.embeddings
        vectors = []
        for e in embeddings:
            t = e.multi_vector
            if t.dtype != pb.FLOAT32 or len(t.shape) != 2 or t.shape[1] != size or len(t.data) != 4 * t.shape[0] * size:
                raise AttnserveError(f"server {self.target} sent a malformed reply: multi-vector embeddings that are "
                                     f"not [tokens, {size}] float32")
            vectors.append(np.frombuffer(t.data, dtype="<f4").reshape(t.shape[0], size))
        if len(vectors) != n:
            raise AttnserveError(f"server {self.target} sent a malformed reply: {len(vectors)} embeddings for {n} "
                                 "inputs")
        pending, rows = request.pending, request.rows
        for row, v in zip(rows, vectors, strict=True):
            pending.embeddings[row] = v
        self._counted(embeddings, request)

    def _take_chunks(self, reply: pb.EmbedResponse, request: _Request, size: int) -> None:
        """One reply of late chunks ([size] each, with their spans) into its chunk's rows."""
        n, embeddings = len(request.rows), reply.embeddings
        if len(embeddings) != n:
            raise AttnserveError(f"server {self.target} sent a malformed reply: {len(embeddings)} embeddings for {n} "
                                 "inputs")
        pending = request.pending
        assert pending.chunks is not None
        for row, e in zip(request.rows, embeddings, strict=True):
            if not e.chunks or any(c.embedding.dtype != pb.FLOAT32 or len(c.embedding.data) != 4 * size
                                   for c in e.chunks):
                raise AttnserveError(f"server {self.target} sent a malformed reply: late chunks that are not "
                                     f"[{size}] float32, or none")
            pending.embeddings[row] = np.frombuffer(b"".join(c.embedding.data for c in e.chunks),
                                                    dtype="<f4").reshape(len(e.chunks), size)
            pending.chunks[row] = np.asarray([(c.start, c.stop, c.num_tokens) for c in e.chunks], np.int32)
        self._counted(embeddings, request)

    def _take(self, reply: pb.EmbedResponse, request: _Request, size: int) -> None:
        """One reply into its chunk's arrays."""
        n, embeddings = len(request.rows), reply.embeddings
        if request.message.HasField("multi_vector") and request.pending.multi_vector is None:  # a ColBERT model's
            self._take_vectors(reply, request, size)
            return
        if request.message.HasField("late_chunking"):
            self._take_chunks(reply, request, size)
            return
        if len(embeddings) != n or any(e.sentence_embedding.dtype != pb.FLOAT32 for e in embeddings):
            raise AttnserveError(f"server {self.target} sent a malformed reply: {len(embeddings)} embeddings "
                                 f"for {n} inputs, or not float32")
        data = b"".join(e.sentence_embedding.data for e in embeddings)
        if len(data) != 4 * n * size:
            raise AttnserveError(f"server {self.target} sent a malformed reply: {len(data)} bytes of embeddings "
                                 f"for {n} inputs of size {size}")
        request.pending.embeddings[request.rows] = np.frombuffer(data, dtype="<f4").reshape(n, size)
        self._take_bge_m3(embeddings, request)
        self._counted(embeddings, request)

    def _take_bge_m3(self, embeddings, request: _Request) -> None:
        """bge-m3's sparse and multi-vector embeddings of a reply, where the run asked for them."""
        pending, size = request.pending, self.info.multi_vector_size
        for row, e in zip(request.rows, embeddings, strict=True):
            if pending.sparse is not None:
                s = e.sparse_embedding
                if len(s.indices) != len(s.values):
                    raise AttnserveError(f"server {self.target} sent a malformed reply: sparse indices and values "
                                         "of different lengths")
                pending.sparse[row] = (np.asarray(s.indices, np.int32), np.asarray(s.values, np.float32))
            if pending.multi_vector is not None:
                t = e.multi_vector
                if t.dtype != pb.FLOAT32 or len(t.shape) != 2 or t.shape[1] != size or \
                        len(t.data) != 4 * t.shape[0] * size:
                    raise AttnserveError(f"server {self.target} sent a malformed reply: multi-vector embeddings "
                                         f"that are not [tokens, {size}] float32")
                pending.multi_vector[row] = np.frombuffer(t.data, dtype="<f4").reshape(t.shape[0], size)

    @staticmethod
    def _counted(embeddings, request: _Request) -> None:
        """A reply's token counts and truncation marks into its chunk's rows, and its rows done."""
        pending, rows, n = request.pending, request.rows, len(request.rows)
        num_tokens = [e.num_tokens for e in embeddings]
        pending.num_tokens[rows] = num_tokens
        pending.truncated[rows] = [e.truncated for e in embeddings]
        pending.left -= n
        # The server batches as it sees fit and does not report its padding: cells are counted as tokens.
        tokens = sum(num_tokens)
        pending.stats.add(EncodeStats(texts=n, tokens=tokens, cells=tokens))


def _item_size(record: Record) -> int:
    """Bytes a row adds to a request, about: its UTF-8 text (or 10 per token id, or its image's bytes) and some
    framing."""
    if record.image is not None:
        return 16 + len(record.image)
    item = record.input
    return 16 + (len(item.encode("utf-8")) if isinstance(item, str) else 10 * len(item))


def encode_file_remote(job: EncodeJob, config: ClientConfig, **driver) -> EncodeResult:
    """Encode job.input into job.output through the server at config.target; returns the summary's totals.

    The totals' cells equal their tokens: the server does not report the padding of its batches, so the
    summary line's padding reads n/a for a run through a server.
    """
    encoder = ServerEncoder(config, job.model)
    try:
        return run_job(job, encoder, **driver)
    finally:
        encoder.close()
