"""A small local server that speaks the Anthropic Messages API, for tests that drive the real `anthropic` SDK
over real HTTP (imported as `messages_server`; pytest puts tests/ on sys.path).

The test scripts the replies first-in first-out, then points a client at `server.base_url`:

    with MessagesServer() as server:
        server.text(["Hel", "lo"])
        client = anthropic.Anthropic(api_key="sk-test", base_url=server.base_url, max_retries=0)
        with client.messages.stream(model="m", max_tokens=64, messages=[...]) as stream:
            assert "".join(stream.text_stream) == "Hello"
        assert server.last_request.api_key == "sk-test"

Wire details, matched to what anthropic 2.x (on `httpx2`/`httpcore2`/`h11`) sends and expects:

- only `POST /v1/messages` is served (anything else is a 404 `not_found_error`); a missing `model`,
  `max_tokens` or `messages` is a 400 `invalid_request_error` that does not consume a scripted reply;
- the key is read from `Authorization: Bearer …` or `x-api-key`; pass `api_key=` to make the server answer
  a wrong or missing key with 401 itself;
- the server speaks HTTP/1.1 with keep-alive. Plain JSON replies carry `Content-Length`. Event streams use
  `Transfer-Encoding: chunked`, one chunk per event, so the end of a stream is framed: a connection closed
  mid-stream is then a protocol error on the client, not a quiet end of the body (which it would be for a
  close-delimited body);
- every reply has a `request-id: req_…` header (the SDK exposes it as `request_id`);
- `message_start` carries `usage.input_tokens`, `cache_creation_input_tokens` and `cache_read_input_tokens`.
  When the request has any `cache_control` (on system, tools, message blocks or top level), the tools, the
  system part and the message blocks up to the last one marked are the cached prefix, as the API caches it:
  its first sight is reported as cache creation, every later request with the same prefix as a cache read.
  Without `cache_control` both are 0.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import secrets
import socket
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, Self

import pytest

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_ids = itertools.count(1)


def _new_id(prefix: str) -> str:
    return f"{prefix}{next(_ids):04d}{secrets.token_hex(8)}"


def _tokens(value: object) -> int:
    """A stable, rough token count: about four characters a token, at least one."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return max(1, math.ceil(len(text) / 4))


def _cached_blocks(messages: list[Any]) -> list[Any]:
    """The message blocks up to and including the last one with `cache_control`: with tools and system, the
    prefix the API caches at that breakpoint ([] when no message block has one)."""
    blocks = [
        block
        for message in messages
        for block in (message.get("content") if isinstance(message.get("content"), list) else [])
    ]
    marked = [i for i, block in enumerate(blocks) if isinstance(block, dict) and "cache_control" in block]
    return blocks[: marked[-1] + 1] if marked else []


def _has_cache_control(value: object) -> bool:
    if isinstance(value, dict):
        return "cache_control" in value or any(_has_cache_control(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_cache_control(v) for v in value)
    return False


def _split(text: str, pieces: int) -> list[str]:
    """`text` cut into at most `pieces` consecutive, non-empty fragments."""
    pieces = max(1, min(pieces, len(text)))
    size = math.ceil(len(text) / pieces)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# ----------------------------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class TextSpec:
    """A text content block, streamed as one `text_delta` per chunk."""

    chunks: tuple[str, ...]


@dataclass(frozen=True)
class ToolUseSpec:
    """A tool_use content block; its JSON input is streamed as `fragments` `input_json_delta` pieces."""

    name: str
    input: dict[str, Any]
    id: str
    fragments: int = 3


Block = TextSpec | ToolUseSpec


@dataclass(frozen=True)
class Reply:
    """One scripted reply. Build them with the class methods (or the `MessagesServer` methods that enqueue
    them); `responder` callables return them too."""

    kind: Literal["message", "error", "drop", "stream_error"]
    blocks: tuple[Block, ...] = ()
    stop_reason: str = "end_turn"
    status: int = 200
    error_type: str = ""
    error_message: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    after_chunks: int = 0
    reset: bool = False
    delay: float = 0.0
    chunk_delay: float = 0.0
    usage: tuple[tuple[str, int], ...] = ()

    @classmethod
    def text(
        cls,
        chunks: list[str] | tuple[str, ...],
        stop_reason: str = "end_turn",
        *,
        chunk_delay: float = 0.0,
        usage: Mapping[str, int] | None = None,
    ) -> Reply:
        return cls(
            kind="message",
            blocks=(TextSpec(tuple(chunks)),),
            stop_reason=stop_reason,
            chunk_delay=chunk_delay,
            usage=tuple((usage or {}).items()),
        )

    @classmethod
    def tool_use(
        cls,
        name: str,
        input: dict[str, Any],
        text_before: str | None = None,
        id: str | None = None,
        *,
        fragments: int = 3,
        chunk_delay: float = 0.0,
        usage: Mapping[str, int] | None = None,
    ) -> Reply:
        blocks: list[Block] = []
        if text_before:
            blocks.append(TextSpec((text_before,)))
        blocks.append(ToolUseSpec(name, dict(input), id or _new_id("toolu_"), fragments))
        return cls(
            kind="message",
            blocks=tuple(blocks),
            stop_reason="tool_use",
            chunk_delay=chunk_delay,
            usage=tuple((usage or {}).items()),
        )

    @classmethod
    def message(
        cls,
        *blocks: Block,
        stop_reason: str = "end_turn",
        chunk_delay: float = 0.0,
        usage: Mapping[str, int] | None = None,
    ) -> Reply:
        """Any sequence of blocks, e.g. text and then two parallel tool calls (see `text_block`,
        `tool_block`)."""
        return cls(
            kind="message",
            blocks=tuple(blocks),
            stop_reason=stop_reason,
            chunk_delay=chunk_delay,
            usage=tuple((usage or {}).items()),
        )

    @classmethod
    def error(
        cls,
        status: int,
        type: str | None = None,
        message: str | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        retry_after: float | None = None,
    ) -> Reply:
        """An HTTP error with the API's body `{"type": "error", "error": {"type": …, "message": …}}`; `type`
        defaults from the status (401 authentication_error, 429 rate_limit_error, 529 overloaded_error, …)."""
        error_type = type or ERROR_TYPES.get(status, "api_error")
        all_headers = dict(headers or {})
        if retry_after is not None:
            all_headers["retry-after"] = f"{retry_after:g}"
        return cls(
            kind="error",
            status=status,
            error_type=error_type,
            error_message=message or f"scripted {error_type} ({status})",
            headers=tuple(all_headers.items()),
        )

    @classmethod
    def drop(cls, after_chunks: int = 1, *, reset: bool = False, chunks: list[str] | None = None) -> Reply:
        """Start a text reply, send `after_chunks` text deltas, then close the socket without ending the
        chunked body (`reset=True`: with a TCP RST instead of a FIN). A non-streaming request gets a
        truncated JSON body instead."""
        text_chunks = (
            tuple(chunks) if chunks is not None else tuple(f"chunk{i} " for i in range(after_chunks))
        )
        return cls(kind="drop", blocks=(TextSpec(text_chunks),), after_chunks=after_chunks, reset=reset)

    @classmethod
    def stream_error(
        cls, type: str = "overloaded_error", message: str = "Overloaded", *, after_chunks: int = 1
    ) -> Reply:
        """A 200 event stream that sends `after_chunks` text deltas, then an `event: error` (what the API does
        when it fails mid-stream)."""
        text_chunks = tuple(f"chunk{i} " for i in range(after_chunks))
        return cls(
            kind="stream_error",
            blocks=(TextSpec(text_chunks),),
            error_type=type,
            error_message=message,
            after_chunks=after_chunks,
        )

    def delayed(self, seconds: float) -> Reply:
        """This reply, sent only after waiting `seconds` (before the status line)."""
        return replace(self, delay=seconds)


def text_block(*chunks: str) -> TextSpec:
    return TextSpec(tuple(chunks))


def tool_block(name: str, input: dict[str, Any], id: str | None = None, *, fragments: int = 3) -> ToolUseSpec:
    return ToolUseSpec(name, dict(input), id or _new_id("toolu_"), fragments)


Responder = Callable[[dict[str, Any]], Reply | None]


# ------------------------------------------------------------------------------------------- recording


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it. `headers` has lower-cased names."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    raw: bytes = field(repr=False)
    client_port: int = 0
    """The client's source port: equal ports on two requests mean one kept-alive connection."""

    @property
    def api_key(self) -> str | None:
        """The key from `Authorization: Bearer …`, else from `x-api-key`."""
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:]
        return self.headers.get("x-api-key")

    @property
    def json(self) -> dict[str, Any]:
        assert self.body is not None, f"{self.method} {self.path} had no JSON body"
        return self.body

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))


# -------------------------------------------------------------------------------------------- server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    timeout = 30  # an idle keep-alive connection is dropped after this long

    def log_message(self, format: str, *args: Any) -> None:  # silence the default stderr log
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.owner._track(self.connection, add=False)

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            self.server.owner._handle(self)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client went away (a timeout, a closed stream): nothing to do


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: MessagesServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away while the reply was read (the dropped and reset streams scripted here) is
        expected; anything else is printed, as the base class does."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class MessagesServer:
    """A local Messages API server (ThreadingHTTPServer on 127.0.0.1, random port, daemon thread).

    Replies are taken first-in first-out from the script (`text`, `tool_use`, `message`, `error`, `drop`,
    `stream_error`, `delay`, `enqueue`); when the script is empty, `responder` (if any) is asked with the
    request's JSON body; failing both, the reply is a 500 saying that the test enqueued nothing. Every request
    is recorded in `requests`.
    """

    def __init__(self, *, responder: Responder | None = None, api_key: str | None = None) -> None:
        self.responder = responder
        self.api_key = api_key
        self._script: deque[Reply] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._cached_prefixes: set[str] = set()
        self._connections: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle

    def start(self) -> Self:
        if self._httpd is None:
            self._httpd = _HTTPServer(self)
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "the server is not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>` — give it to `Anthropic(base_url=…)`, which appends `/v1/messages`."""
        return f"http://127.0.0.1:{self.port}"

    # ---- script

    def enqueue(self, *replies: Reply) -> Self:
        with self._lock:
            self._script.extend(replies)
        return self

    def text(
        self,
        chunks: list[str] | tuple[str, ...],
        stop_reason: str = "end_turn",
        *,
        chunk_delay: float = 0.0,
        usage: Mapping[str, int] | None = None,
    ) -> Self:
        return self.enqueue(Reply.text(chunks, stop_reason, chunk_delay=chunk_delay, usage=usage))

    def tool_use(
        self,
        name: str,
        input: dict[str, Any],
        text_before: str | None = None,
        id: str | None = None,
        *,
        fragments: int = 3,
        chunk_delay: float = 0.0,
        usage: Mapping[str, int] | None = None,
    ) -> Self:
        return self.enqueue(
            Reply.tool_use(
                name, input, text_before, id, fragments=fragments, chunk_delay=chunk_delay, usage=usage
            )
        )

    def message(
        self,
        *blocks: Block,
        stop_reason: str = "end_turn",
        chunk_delay: float = 0.0,
        usage: Mapping[str, int] | None = None,
    ) -> Self:
        return self.enqueue(
            Reply.message(*blocks, stop_reason=stop_reason, chunk_delay=chunk_delay, usage=usage)
        )

    def error(
        self,
        status: int,
        type: str | None = None,
        message: str | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        retry_after: float | None = None,
    ) -> Self:
        return self.enqueue(Reply.error(status, type, message, headers, retry_after=retry_after))

    def drop(self, after_chunks: int = 1, *, reset: bool = False, chunks: list[str] | None = None) -> Self:
        return self.enqueue(Reply.drop(after_chunks, reset=reset, chunks=chunks))

    def stream_error(
        self, type: str = "overloaded_error", message: str = "Overloaded", *, after_chunks: int = 1
    ) -> Self:
        return self.enqueue(Reply.stream_error(type, message, after_chunks=after_chunks))

    def delay(self, seconds: float, then: Reply | None = None) -> Self:
        """Wait `seconds` before answering; then send `then` (default: a short text reply)."""
        return self.enqueue((then or Reply.text(["(delayed)"])).delayed(seconds))

    @property
    def pending(self) -> int:
        """How many scripted replies have not been used yet."""
        with self._lock:
            return len(self._script)

    def assert_all_used(self) -> None:
        with self._lock:
            left = list(self._script)
        assert not left, f"{len(left)} scripted replies were never requested: {[r.kind for r in left]}"

    # ---- recording

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def last_request(self) -> RecordedRequest:
        with self._lock:
            assert self._requests, "no request has reached the server"
            return self._requests[-1]

    # ---- serving (handler threads)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _handle(self, h: _Handler) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in h.headers.items()}
        body: dict[str, Any] | None = None
        parse_error = ""
        if raw:
            try:
                parsed = json.loads(raw)
                body = parsed if isinstance(parsed, dict) else None
                parse_error = "" if body is not None else "the body must be a JSON object"
            except ValueError as exc:
                parse_error = f"the body is not JSON: {exc}"
        request = RecordedRequest(h.command, h.path, headers, body, raw, int(h.client_address[1]))
        with self._lock:
            self._requests.append(request)

        path = h.path.split("?", 1)[0]
        if h.command != "POST" or path != "/v1/messages":
            return self._send_error(h, Reply.error(404, message=f"no route for {h.command} {h.path}"))
        if self.api_key is not None and request.api_key != self.api_key:
            return self._send_error(h, Reply.error(401, message="invalid x-api-key"))
        if parse_error or body is None:
            return self._send_error(h, Reply.error(400, message=parse_error or "the request has no body"))
        missing = [k for k in ("model", "max_tokens", "messages") if k not in body]
        if missing:
            return self._send_error(h, Reply.error(400, message=f"{', '.join(missing)}: Field required"))

        reply = self._next_reply(body)
        if reply.delay and self._closing.wait(reply.delay):
            h.close_connection = True
            return None
        if reply.kind == "error":
            return self._send_error(h, reply)
        if request.stream:
            return self._send_stream(h, body, reply)
        return self._send_json_message(h, body, reply)

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        if scripted is not None:
            return scripted
        if self.responder is not None:
            dynamic = self.responder(body)
            if dynamic is not None:
                return dynamic
        return Reply.error(
            500,
            "api_error",
            "MessagesServer: the test enqueued nothing for this request "
            "(script empty and no responder): call server.text(...), server.tool_use(...), ... first",
        )

    def _usage(self, body: dict[str, Any], reply: Reply) -> dict[str, int]:
        total = _tokens(body.get("system", "")) + _tokens(body.get("tools", [])) + _tokens(body["messages"])
        creation = read = 0
        if _has_cache_control(body):
            blocks = _cached_blocks(body["messages"])
            prefix = json.dumps(
                [body.get("model"), body.get("tools"), body.get("system"), blocks], sort_keys=True
            )
            cached = _tokens(body.get("tools", [])) + _tokens(body.get("system", ""))
            cached += _tokens(blocks) if blocks else 0
            with self._lock:
                seen = prefix in self._cached_prefixes
                self._cached_prefixes.add(prefix)
            if seen:
                read = cached
            else:
                creation = cached
            total -= cached
        output = sum(
            _tokens("".join(b.chunks)) if isinstance(b, TextSpec) else _tokens(b.input) for b in reply.blocks
        )
        usage = {
            "input_tokens": max(total, 1),
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read,
            "output_tokens": output,
        }
        usage.update(dict(reply.usage))
        return usage

    def _start_headers(self, h: _Handler, status: int, extra: Mapping[str, str]) -> None:
        h.send_response(status)
        h.send_header("request-id", _new_id("req_"))
        for name, value in extra.items():
            h.send_header(name, value)

    def _send_error(self, h: _Handler, reply: Reply) -> None:
        payload = {"type": "error", "error": {"type": reply.error_type, "message": reply.error_message}}
        data = json.dumps(payload).encode()
        self._start_headers(h, reply.status, dict(reply.headers))
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    def _content(self, reply: Reply) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        for block in reply.blocks:
            if isinstance(block, TextSpec):
                content.append({"type": "text", "text": "".join(block.chunks)})
            else:
                content.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
        return content

    def _send_json_message(self, h: _Handler, body: dict[str, Any], reply: Reply) -> None:
        message = {
            "id": _new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": self._content(reply),
            "stop_reason": reply.stop_reason,
            "stop_sequence": None,
            "usage": self._usage(body, reply),
        }
        data = json.dumps(message).encode()
        self._start_headers(h, 200, {})
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        if reply.kind == "drop":
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            self._abort(h, reset=reply.reset)
            return
        h.wfile.write(data)
        h.wfile.flush()

    # -- event streams

    def _events(self, body: dict[str, Any], reply: Reply) -> Iterator[tuple[str, dict[str, Any], bool]]:
        """(event type, data, is a content delta) in wire order."""
        usage = self._usage(body, reply)
        start_usage = {k: v for k, v in usage.items() if k != "output_tokens"} | {"output_tokens": 1}
        yield (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": _new_id("msg_"),
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
            False,
        )
        yield "ping", {"type": "ping"}, False
        for index, block in enumerate(reply.blocks):
            if isinstance(block, TextSpec):
                start: dict[str, Any] = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": c} for c in block.chunks]
            else:
                start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
                pieces = ["", *_split(json.dumps(block.input), block.fragments)]
                deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
            yield (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
                False,
            )
            for delta in deltas:
                yield (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    True,
                )
            yield "content_block_stop", {"type": "content_block_stop", "index": index}, False
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
            False,
        )
        yield "message_stop", {"type": "message_stop"}, False

    def _send_stream(self, h: _Handler, body: dict[str, Any], reply: Reply) -> None:
        self._start_headers(h, 200, {})
        h.send_header("content-type", "text/event-stream; charset=utf-8")
        h.send_header("cache-control", "no-cache")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        h.wfile.flush()

        def chunk(event: str, data: dict[str, Any]) -> None:
            payload = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
            h.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            h.wfile.flush()

        deltas = 0
        for event, data, is_delta in self._events(body, reply):
            if is_delta:
                if reply.kind in ("drop", "stream_error") and deltas >= reply.after_chunks:
                    break
                if reply.chunk_delay and self._closing.wait(reply.chunk_delay):
                    h.close_connection = True
                    return
                deltas += 1
            elif reply.kind in ("drop", "stream_error") and event == "content_block_stop":
                break
            chunk(event, data)
        if reply.kind == "drop":
            self._abort(h, reset=reply.reset)
            return
        if reply.kind == "stream_error":
            err = {"type": "error", "error": {"type": reply.error_type, "message": reply.error_message}}
            chunk("error", err)
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    def _abort(self, h: _Handler, *, reset: bool) -> None:
        h.close_connection = True
        conn = h.connection
        with contextlib.suppress(OSError):
            if reset:  # SO_LINGER 0: close() sends RST instead of FIN
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@pytest.fixture
def messages_server() -> Iterator[MessagesServer]:
    """A running server for one test (import it into a test module, or wrap it in a local fixture)."""
    with MessagesServer() as server:
        yield server


def conversation_of(body: dict[str, Any]) -> list[Any]:
    """The messages of a request as the conversation: each one's text, the run digest's data block (which the
    diagnosis puts first in the first user message) left out."""
    out: list[Any] = []
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, list):
            blocks = [b for b in content if not str(b.get("text", "")).startswith("<run_digest>")]
            texts = [b["text"] for b in blocks if b.get("type") == "text"]
            content = texts[0] if len(texts) == len(blocks) == 1 else blocks
        out.append(content)
    return out
