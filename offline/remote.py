"""`attnserve encode --server HOST:PORT`: encode a file through a running attnserve server over EmbedStream.

The model is not loaded here. The input is read in chunks and checked row by
row exactly as the local path does (offline/encode.py: RowChecks, on_error,
resumable parts through offline/partial.py). Each chunk's good rows are sorted
by estimated length and cut into requests of up to REQUEST_INPUTS inputs,
which go out pipelined over ONE EmbedStream call, so the server's batcher sees
many requests at once and batches inputs of similar length across them. The
requests in flight are bounded (in number and in estimated tokens), so a large
file never sits in memory or in the server's queue. Replies come back in
request order; a chunk is put back in input order and written as one part
once its last reply is in, so the output has the local path's rows, order
and schema (offline/rows.py), with "server" added to its metadata.

Errors: the server names a bad input "request k: input i: ..."; that is turned
back into the file's line ("FILE: line N: ..."), as the local path names it
(with on_error "skip" the row is set aside instead). RESOURCE_EXHAUSTED (the
server's queue is full) is retried from the first unanswered request on a new
stream, with backoff. Anything else (unreachable, UNAVAILABLE, no reply within
the client timeout) stops the run with one line; a run started again with the
same arguments resumes after the chunks already written.
"""

from __future__ import annotations

import logging
import queue
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import grpc
import numpy as np
import pyarrow as pa

from attnserve import __version__
from attnserve.client.client import open_channel
from attnserve.config import ClientConfig
from attnserve.engine.engine import EncodeStats
from attnserve.errors import AttnserveError, InvalidInputError
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

from .encode import EncodeJob, EncodeResult, RowChecks, error_line, good_rows
from .partial import PartialRun
from .readers import InputFile, Record
from .rows import output_schema

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
# RESOURCE_EXHAUSTED is the server's "queue full, retry with backoff": other clients are filling its queue.
# The server ends the stream at the request it could not queue; the replies before it are good and the
# requests after it were dropped unanswered. So we reopen the stream and resend from the first unanswered
# request, in order -- no row is lost or answered twice -- after a backoff of 0.5, 1, 2, 4, 8 s (with
# jitter), halving our own window each time (it grows back as replies arrive). The count starts over
# whenever a reply arrives; after RETRIES failures in a row we give up with the server's message.
RETRIES = 5
BACKOFF_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 8.0
# A request's bytes are kept under this share of the server's max_request_bytes (room for framing); grpc
# itself refuses a larger message with RESOURCE_EXHAUSTED, which no retry would fix.
REQUEST_BYTES_SHARE = 0.5

log = logging.getLogger("attnserve.offline.remote")

_INPUT_ERROR = re.compile(r"^request (\d+): input (\d+): (.*)$", re.DOTALL)
_REQUEST_ERROR = re.compile(r"^request (\d+): (.*)$", re.DOTALL)
_END = object()
SKIP_HINT = " (--on-error skip sets such rows aside)"


def estimate_tokens(record: Record) -> int:
    """Tokens a row takes before truncation, without the tokenizer: ~1 per 3 characters, plus 2 special.

    English word pieces average over 4 characters, so this errs high for the window's budget; CJK text and
    punctuation runs come closer to 1 per character, which the server's own queue limit then catches.
    """
    if record.token_ids is not None:
        return len(record.token_ids)
    return 2 + len(record.text) // 3


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(eq=False)
class _Chunk:
    """One input chunk: its good rows' outputs, filled as replies arrive, and its bad rows."""

    index: int
    rows: int  # all the chunk's rows, bad ones included
    records: list[Record]  # the good rows, in input order
    embeddings: np.ndarray
    num_tokens: np.ndarray
    truncated: np.ndarray
    keep: np.ndarray  # False: the server refused the row and it was set aside (on_error "skip")
    errors: list[tuple[int, dict]]  # (row, line of the skipped-rows file)
    left: int  # good rows not answered yet


@dataclass(eq=False)
class _Request:
    chunk: _Chunk
    rows: list[int]  # positions in chunk.records, in the request's input order
    tokens: int  # estimated, after truncation: what the request costs the server's queue
    message: pb.EmbedRequest = field(repr=False, default=None)


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


class _RemoteRun:
    def __init__(self, job: EncodeJob, config: ClientConfig):
        self.job, self.config, self.target = job, config, config.target
        self.channel = open_channel(config)
        self.stub = encoder_pb2_grpc.EncoderStub(self.channel)
        self.schema: pa.Schema | None = None

    # --- the server -------------------------------------------------------------

    def model_info(self) -> pb.ModelInfo:
        try:
            return self.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self.config.timeout)
        except grpc.RpcError as error:
            raise self._error(error) from None

    def _error(self, error: grpc.RpcError, retries: int = 0) -> AttnserveError:
        code, details = error.code(), _one_line(error.details() or "")
        if code == grpc.StatusCode.UNAVAILABLE:
            return AttnserveError(f"server {self.target} is unavailable: {details}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return AttnserveError(f"server {self.target} did not answer within {self.config.timeout:g}s "
                                  "(ATTNSERVE_TIMEOUT)")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and retries:
            return AttnserveError(f"server {self.target} is overloaded; gave up after {retries} retries: {details}")
        return AttnserveError(f"server {self.target}: {code.name}: {details}")

    # --- the input, as chunks and requests ----------------------------------------

    def items(self, source: InputFile, info: pb.ModelInfo, run: PartialRun, checks: RowChecks, metadata: dict
              ) -> Iterator[_Chunk | _Request]:
        """Each chunk still to do, followed by its requests: good rows sorted by estimated length."""
        limits = info.limits
        max_inputs = max(1, min(REQUEST_INPUTS, limits.max_inputs_per_request or REQUEST_INPUTS))
        max_tokens = max(1, min(REQUEST_TOKENS, (limits.max_queue_tokens or 1 << 30) // WINDOW_QUEUE_SHARE))
        max_bytes = int((limits.max_request_bytes or 4 << 20) * REQUEST_BYTES_SHARE)
        for index, records in enumerate(source.chunks(self.job.chunk_rows)):
            bad = checks.bad(records)
            self.schema = self.schema or output_schema(source.id_type or int, info.hidden_size, metadata)
            if index < run.chunks_done:
                continue
            good = good_rows(source, records, bad, self.job.on_error)
            n = len(good)
            chunk = _Chunk(index, len(records), good, np.empty((n, info.hidden_size), np.float32),
                           np.empty(n, np.int32), np.empty(n, bool), np.ones(n, bool),
                           [(r.row, error_line(r, reason)) for r, reason in bad], n)
            yield chunk
            estimates = [estimate_tokens(r) for r in good]
            order = sorted(range(n), key=estimates.__getitem__) if SORT_BY_LENGTH else range(n)
            start = 0
            while start < n:
                request = _Request(chunk, [], 0, self._new_message())
                size = 0
                for i in order[start:start + max_inputs]:
                    record, cost = good[i], min(estimates[i], info.max_seq_length)
                    item_size = 16 + (len(record.text.encode()) if record.text is not None
                                      else 10 * len(record.token_ids))
                    if item_size > max_bytes:
                        raise InvalidInputError(
                            f"{source.path}: {record.where}: {item_size / 2**20:.1f} MiB, too large for one "
                            f"request to {self.target} (max_request_bytes "
                            f"{limits.max_request_bytes / 2**20:.1f} MiB); encode it without --server")
                    if request.rows and (request.tokens + cost > max_tokens or size + item_size > max_bytes):
                        break
                    if record.text is not None:
                        request.message.inputs.add(text=record.text)
                    else:
                        request.message.inputs.add(token_ids=pb.TokenIds(ids=record.token_ids))
                    request.rows.append(i)
                    request.tokens += cost
                    size += item_size
                start += len(request.rows)
                yield request

    def _new_message(self) -> pb.EmbedRequest:
        message = pb.EmbedRequest(truncate=True)  # offline semantics: over-long inputs are cut and marked
        if self.job.normalize is not None:  # unset: the model's own default, as the local path has it
            message.normalize = self.job.normalize
        return message

    @staticmethod
    def _refused_input(request: _Request, k: int, details: str) -> tuple[int, str] | None:
        """'request k: input i: empty text' -> (i, 'empty text'), when it names an input of `request`, the
        k-th of its stream (the server answers in order, so the request it refuses is the first unanswered)."""
        match = _INPUT_ERROR.match(details)
        if match and int(match.group(1)) == k and int(match.group(2)) < len(request.rows):
            return int(match.group(2)), _one_line(match.group(3))
        return None

    def _input_error(self, source: InputFile, request: _Request, k: int, details: str) -> InvalidInputError:
        refused = self._refused_input(request, k, details)
        if refused:
            record = request.chunk.records[request.rows[refused[0]]]
            return InvalidInputError(f"{source.path}: {record.where}: {refused[1]}{SKIP_HINT}")
        match = _REQUEST_ERROR.match(details)
        first = request.chunk.records[min(request.rows)]
        return InvalidInputError(f"{source.path}: server {self.target} refused a request of {len(request.rows)} "
                                 f"rows from {first.where} on: {_one_line(match.group(2) if match else details)}")

    # --- the run --------------------------------------------------------------------

    def run(self) -> EncodeResult:
        from tqdm import tqdm

        job = self.job
        source = InputFile(job.input, job.text_column, job.id_column)
        if job.output.is_dir():
            raise InvalidInputError(f"output {job.output} is a directory; give a .parquet file name")
        info = self.model_info()
        normalize = info.normalize if job.normalize is None else job.normalize
        stat = job.input.stat()
        fingerprint = {  # what makes two runs the same run, as offline/encode.py has it, with the server
            "input": str(job.input.resolve()), "input_bytes": stat.st_size, "input_mtime_ns": stat.st_mtime_ns,
            "text_column": job.text_column, "id_column": job.id_column, "chunk_rows": job.chunk_rows,
            "on_error": job.on_error, "normalize": normalize, "model": info.model, "precision": info.precision,
            "server": self.target, "attnserve": __version__}
        run = PartialRun(job.output, fingerprint, job.overwrite)
        metadata = {"model": info.model, "precision": info.precision, "pooling": info.pooling,
                    "normalize": normalize, "input": str(job.input), "server": self.target}
        result, start = EncodeResult(padding_known=False), time.perf_counter()
        result.resumed_rows = run.rows_done
        # disable=None: a bar on a terminal only, never in logs or pipes.
        bar = tqdm(total=source.count_rows(), initial=run.rows_done, unit="text",
                   disable=None if job.progress else True, dynamic_ncols=True, desc="encode")
        # As offline/encode.py: ids that are row numbers (.txt, Parquet without an id column) cannot repeat.
        track_ids = source.format == "jsonl" or (source.format == "parquet" and source.id_type is not None)
        items = self.items(source, info, run, RowChecks(info.vocab_size, track_ids), metadata)
        chunks: deque[_Chunk] = deque()  # read and not yet written, in input order
        # Their rows: bounded to about two chunks and a window, so the next chunk's requests follow the last
        # ones of this chunk without a pause, and rows of chunks without good rows cannot pile up.
        chunk_rows = 0
        unsent: deque[_Request] = deque()  # to send (again) first, after the server ended a stream
        pending: deque[_Request] = deque()  # sent on the current stream and unanswered, in order
        window = full_window = max(info.max_seq_length, (info.limits.max_queue_tokens or 65536) // WINDOW_QUEUE_SHARE)
        in_flight, exhausted, failures = 0, False, 0
        stream, sending, answered = _Stream(self.stub), True, 0  # answered: replies on this stream
        try:
            while True:
                while sending and len(pending) < WINDOW_REQUESTS and (not pending or in_flight < window):
                    if unsent:
                        request = unsent.popleft()
                    elif exhausted or chunk_rows >= 2 * job.chunk_rows + WINDOW_REQUESTS * REQUEST_INPUTS:
                        if exhausted:  # all sent: the server answers what it holds, then ends the stream
                            sending = False
                            stream.close_sending()
                        break
                    else:
                        item = next(items, None)
                        if item is None:
                            exhausted = True
                            continue
                        if isinstance(item, _Chunk):
                            chunks.append(item)
                            chunk_rows += item.rows
                            continue
                        request = item
                    stream.send(request.message)
                    pending.append(request)
                    in_flight += request.tokens
                chunk_rows -= self._write_done(chunks, run, result, bar)
                if not pending:
                    if exhausted and not unsent:
                        break
                    continue
                try:
                    reply = stream.receive(self.config.timeout)
                except TimeoutError:
                    raise AttnserveError(f"server {self.target} sent no reply for {self.config.timeout:g}s "
                                         "(ATTNSERVE_TIMEOUT)") from None
                except grpc.RpcError as error:
                    code, details = error.code(), error.details() or ""
                    if code == grpc.StatusCode.INVALID_ARGUMENT:
                        refused = self._refused_input(pending[0], answered, details)
                        if job.on_error != "skip" or refused is None:
                            raise self._input_error(source, pending[0], answered, details) from None
                        self._set_aside(pending, refused, result)
                    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and details.startswith("request ") \
                            and failures < RETRIES:
                        # The server's queue-full answer ("request k: queue full ..."), not grpc's message-size
                        # limit, which a retry cannot fix: back off, then resend from pending[0] on.
                        delay = min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2 ** failures) * random.uniform(0.8, 1.2)
                        log.info("server queue full; resending %d requests in %.2fs (retry %d of %d): %s",
                                 len(pending), delay, failures + 1, RETRIES, _one_line(details))
                        time.sleep(delay)
                        failures += 1
                        window = max(info.max_seq_length, window // 2)
                    else:
                        raise self._error(error, failures) from None
                    unsent.extendleft(reversed(pending))  # sent before anything in unsent: they go first
                    pending.clear()
                    in_flight = 0
                    stream.cancel()
                    stream, sending, answered = _Stream(self.stub), True, 0
                    continue
                if reply is None:
                    raise AttnserveError(f"server {self.target} ended the stream with {len(pending)} requests "
                                         "unanswered")
                request = pending.popleft()
                answered += 1
                in_flight -= request.tokens
                failures = 0
                window = min(full_window, window + info.max_seq_length)
                self._take(reply, request, info.hidden_size, result)
                bar.update(len(request.rows))
                bar.set_postfix(tokens_per_s=f"{result.tokens / (time.perf_counter() - start):.0f}", refresh=False)
            # An empty input (an empty partition, say) gives an empty output with the same schema.
            schema = self.schema or output_schema(source.id_type or int, info.hidden_size, metadata)
            run.finish(schema, job.errors_path if job.on_error == "skip" else None)
        finally:
            stream.cancel()
            bar.close()
        result.seconds = time.perf_counter() - start
        return result

    def _set_aside(self, pending: deque[_Request], refused: tuple[int, str], result: EncodeResult) -> None:
        """on_error "skip": the input the server refused leaves its request, to the chunk's skipped rows."""
        request = pending[0]
        i, reason = refused
        chunk, position = request.chunk, request.rows.pop(i)
        record = chunk.records[position]
        chunk.keep[position] = False
        chunk.errors.append((record.row, error_line(record, reason)))
        chunk.left -= 1
        del request.message.inputs[i]
        if not request.rows:
            pending.popleft()

    def _take(self, reply: pb.EmbedResponse, request: _Request, hidden: int, result: EncodeResult) -> None:
        """One reply into its chunk's arrays."""
        n, embeddings = len(request.rows), reply.embeddings
        if len(embeddings) != n or any(e.sentence_embedding.dtype != pb.FLOAT32 for e in embeddings):
            raise AttnserveError(f"server {self.target} sent a malformed reply: {len(embeddings)} embeddings "
                                 f"for {n} inputs, or not float32")
        data = b"".join(e.sentence_embedding.data for e in embeddings)
        if len(data) != 4 * n * hidden:
            raise AttnserveError(f"server {self.target} sent a malformed reply: {len(data)} bytes of embeddings "
                                 f"for {n} inputs of size {hidden}")
        chunk, rows = request.chunk, request.rows
        chunk.embeddings[rows] = np.frombuffer(data, dtype="<f4").reshape(n, hidden)
        num_tokens = [e.num_tokens for e in embeddings]
        chunk.num_tokens[rows] = num_tokens
        chunk.truncated[rows] = [e.truncated for e in embeddings]
        chunk.left -= n
        # The server batches as it sees fit and does not report its padding: cells are counted as tokens.
        tokens = sum(num_tokens)
        result.add(EncodeStats(texts=n, tokens=tokens, cells=tokens))

    def _write_done(self, chunks: deque[_Chunk], run: PartialRun, result: EncodeResult, bar) -> int:
        """Write the finished chunks at the front, in order; returns how many rows they held."""
        rows = 0
        while chunks and chunks[0].left == 0:
            chunk = chunks.popleft()
            keep = chunk.keep.all()
            records = chunk.records if keep else [r for r, k in zip(chunk.records, chunk.keep) if k]
            table = pa.Table.from_arrays(
                [pa.array([r.id for r in records], type=self.schema.field("id").type),
                 pa.FixedSizeListArray.from_arrays(
                     (chunk.embeddings if keep else chunk.embeddings[chunk.keep]).reshape(-1),
                     self.schema.field("embedding").type.list_size),
                 pa.array(chunk.num_tokens if keep else chunk.num_tokens[chunk.keep]),
                 pa.array(chunk.truncated if keep else chunk.truncated[chunk.keep])],
                schema=self.schema)
            errors = [line for _, line in sorted(chunk.errors, key=lambda e: e[0])]
            run.write_chunk(chunk.index, table, chunk.rows, errors)
            result.skipped += len(errors)
            rows += chunk.rows
            bar.update(chunk.rows - int(chunk.keep.sum()))  # the bad rows; the good ones counted as answered
        return rows


def encode_file_remote(job: EncodeJob, config: ClientConfig) -> EncodeResult:
    """Encode job.input into job.output through the server at config.target; returns the summary's totals.

    The totals' cells equal their tokens: the server does not report the padding of its batches, so the
    summary line's padding reads 0.0% for a run through a server.
    """
    encoder = _RemoteRun(job, config)
    try:
        return encoder.run()
    finally:
        encoder.channel.close()
