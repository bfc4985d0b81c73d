"""A small local server that speaks the OpenAI-compatible API the way vLLM, llama.cpp's server and
`ollama serve` do, for tests that drive real HTTP clients (imported as `openai_server`; pytest puts
tests/ on sys.path).

    with OpenAIServer() as server:
        server.reply('{"progress": 1, "correctness": 1}')
        reply = httpx.post(f"{server.base_url}/chat/completions",
                           json={"model": server.model, "messages": [{"role": "user", "content": "hi"}]})
        assert server.requests[-1].json["messages"][0]["content"] == "hi"

Served (HTTP/1.1, keep-alive, JSON bodies with Content-Length, 127.0.0.1 on a free port):

- `POST /v1/chat/completions`, not streaming. The reply's content is the next scripted one
  (`reply(text)`, first in first out; `error(status)` scripts a failure), else `responder(request_json)`,
  else a 500 saying nothing was scripted. With `"logprobs": true` the choice carries
  `logprobs.content`: one entry per token (`token`, `logprob`, `bytes`, `top_logprobs` with
  `top_logprobs` alternatives when asked). Tokens are the content's whitespace-led words, so they
  join back to the content exactly; `max_tokens` (or `max_completion_tokens`) cuts the content to
  that many tokens with `finish_reason: "length"`. Each token has an id (`token_id_of`, below the
  `vocab_size` given): vLLM's `"return_tokens_as_token_ids": true` spells each log-prob entry's token
  `token_id:<id>`, and `"return_token_ids": true` adds `prompt_token_ids` (the messages' contents,
  tokenized the same way) beside the choices and `token_ids` in the choice. `behaviour=False` makes a
  server that gives neither (as Ollama's OpenAI API does): those fields are ignored, `logprobs: null`.
- `GET /v1/models`: the served model and every LoRA adapter loaded at run time.
- `POST /v1/load_lora_adapter` `{lora_name, lora_path[, load_inplace]}` and
  `POST /v1/unload_lora_adapter` `{lora_name}`: vLLM's runtime LoRA API, 200 with a text body. As
  vLLM does, the server reads the adapter from its own disk: a `lora_path` that is not a directory
  holding `adapter_config.json` gets 404 "Loading lora <name> failed: No adapter found for <path>";
  a name already loaded gets 400 (unless `load_inplace`); `fail_loads(status)` scripts a failed load.
  `runtime_lora=False` is vLLM started without `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`: the two routes
  are not there (FastAPI's 404 `{"detail": "Not Found"}`, as for any unknown path). A chat request naming
  a model that is neither served nor loaded gets vLLM's 404 JSON error.
- `api_key=`: a request without `Authorization: Bearer <key>` gets a 401.
- `hold(predicate)`: chat requests whose JSON matches wait until `release()` (or `close()`);
  `wait_held(n)` blocks until n of them are waiting, so a test can act mid-request without sleeping.

Errors have vLLM's shape: `{"object": "error", "message", "type", "param": null, "code": status}`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

ERROR_TYPES = {400: "BadRequestError", 401: "Unauthorized", 404: "NotFoundError", 429: "RateLimitError"}
_ids = itertools.count(1)
_TOKEN = re.compile(r"\s*\S+|\s+")

Responder = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as received: `headers` have lower-cased names; `json` is None without a JSON body."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any


@dataclass(frozen=True)
class _Scripted:
    content: str | None  # None: an error
    status: int = 200
    message: str = ""


def tokens_of(content: str) -> list[str]:
    """The content cut into tokens: each word with the whitespace before it ("".join gives it back)."""
    return _TOKEN.findall(content)


def token_id_of(token: str, vocab_size: int = 512) -> int:
    """A deterministic id for a token, below `vocab_size`."""
    return int.from_bytes(hashlib.sha256(token.encode()).digest()[:4], "big") % vocab_size


def logprob_of(token: str) -> float:
    """A deterministic log-probability for a token, in (-1, 0): longer tokens are less likely."""
    return -round(1 - math.exp(-len(token.strip() or token) / 8), 6)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:  # no stderr log
        pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            self.server.owner._handle(self)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client went away (a timeout, a killed worker)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: OpenAIServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)


class OpenAIServer:
    """An OpenAI-compatible server on 127.0.0.1 (random free port, daemon threads); see the module doc."""

    def __init__(
        self,
        *,
        model: str = "test-model",
        api_key: str | None = None,
        responder: Responder | None = None,
        behaviour: bool = True,
        vocab_size: int = 512,
        runtime_lora: bool = True,
    ) -> None:
        self.model = model
        self.api_key = api_key
        self.responder = responder
        self.behaviour = behaviour  # gives log-probs and token ids when asked (False: ignores both)
        self.vocab_size = vocab_size
        self.runtime_lora = runtime_lora  # vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING: the load/unload routes
        self._script: deque[_Scripted] = deque()
        self._requests: list[RecordedRequest] = []
        self._adapters: dict[str, str] = {}  # LoRA name -> path, in load order
        self._failing_loads: list[int] = []  # HTTP statuses the next adapter loads get (fail_loads)
        self._lock = threading.Condition()
        self._hold: Callable[[dict[str, Any]], bool] | None = None
        self._released = threading.Event()
        self._held = 0
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
        self.release()  # a held request must not keep a handler thread (or the test) waiting
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
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
        """`http://127.0.0.1:<port>/v1`, what OpenAI-compatible clients take as their base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    # ---- script

    def reply(self, *contents: str) -> Self:
        """Queue replies: the next chat requests get these contents, in order."""
        with self._lock:
            self._script.extend(_Scripted(content) for content in contents)
        return self

    def error(self, status: int, message: str | None = None) -> Self:
        """Queue a failure: the next chat request gets this HTTP status and a vLLM-style error body."""
        with self._lock:
            self._script.append(_Scripted(None, status, message or f"scripted error ({status})"))
        return self

    def fail_loads(self, status: int, count: int = 1) -> Self:
        """The next `count` adapter loads get this HTTP status and a vLLM-style error body (vLLM answers
        500 when loading fails on its side)."""
        with self._lock:
            self._failing_loads += [status] * count
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def hold(self, predicate: Callable[[dict[str, Any]], bool]) -> Self:
        """Chat requests whose JSON matches `predicate` wait (unanswered) until `release()`."""
        with self._lock:
            self._hold = predicate
            self._released.clear()
        return self

    def release(self) -> None:
        with self._lock:
            self._hold = None
            self._released.set()
            self._lock.notify_all()

    def wait_held(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Block until `count` requests are being held (False if that did not happen in `timeout`)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._held >= count, timeout)

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    # ---- state

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def adapters(self) -> dict[str, str]:
        """The LoRA adapters loaded now: name -> path."""
        with self._lock:
            return dict(self._adapters)

    # ---- serving (handler threads)

    def _handle(self, h: _Handler) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in h.headers.items()}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            self._requests.append(RecordedRequest(h.command, h.path, headers, body))
        path = h.path.split("?", 1)[0]
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return self._error(h, 401, "Unauthorized")
        routes: dict[tuple[str, str], Callable[[_Handler, Any], None]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("GET", "/v1/models"): self._models,
        }
        if self.runtime_lora:
            routes[("POST", "/v1/load_lora_adapter")] = self._load_adapter
            routes[("POST", "/v1/unload_lora_adapter")] = self._unload_adapter
        route = routes.get((h.command, path))
        if route is None:
            return self._send_json(h, 404, {"detail": "Not Found"})  # FastAPI's answer to an unknown route
        if h.command == "POST" and not isinstance(body, dict):
            return self._error(h, 400, "the body must be a JSON object")
        route(h, body)
        return None

    def _chat(self, h: _Handler, body: dict[str, Any]) -> None:
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return self._error(h, 400, "messages: Field required")
        model = body.get("model")
        with self._lock:
            known = model == self.model or model in self._adapters
        if not known:
            return self._error(h, 404, f"The model `{model}` does not exist.")
        self._wait_if_held(body)
        scripted = self._next(body)
        if scripted.content is None:
            return self._error(h, scripted.status, scripted.message)
        return self._send_json(h, 200, self._completion(body, scripted.content))

    def _wait_if_held(self, body: dict[str, Any]) -> None:
        with self._lock:
            if self._hold is None or not self._hold(body):
                return
            self._held += 1
            self._lock.notify_all()
            self._lock.wait_for(self._released.is_set)
            self._held -= 1

    def _next(self, body: dict[str, Any]) -> _Scripted:
        with self._lock:
            if self._script:
                return self._script.popleft()
        if self.responder is not None:
            return _Scripted(self.responder(body))
        return _Scripted(
            None, 500, "OpenAIServer: nothing scripted (call server.reply(...) or set a responder)"
        )

    def _completion(self, body: dict[str, Any], content: str) -> dict[str, Any]:
        tokens = tokens_of(content)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        finish = "stop"
        if isinstance(limit, int) and 0 < limit < len(tokens):
            tokens, finish = tokens[:limit], "length"
        text = "".join(tokens)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": None,
        }
        vocab = self.vocab_size
        if body.get("logprobs") and self.behaviour:
            alternatives = int(body.get("top_logprobs") or 0)
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {
                "content": [_token_logprob(t, alternatives, vocab if as_ids else None) for t in tokens]
            }
        prompt = [t for m in body["messages"] for t in tokens_of(str(m.get("content", "")))]
        completion = {
            "id": f"chatcmpl-{next(_ids):06d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(tokens),
                "total_tokens": len(prompt) + len(tokens),
            },
        }
        if body.get("return_token_ids") and self.behaviour:
            completion["prompt_token_ids"] = [token_id_of(t, vocab) for t in prompt]
            choice["token_ids"] = [token_id_of(t, vocab) for t in tokens]
        return completion

    def _models(self, h: _Handler, body: Any) -> None:
        created = int(time.time())
        with self._lock:
            adapters = dict(self._adapters)
        base = {"id": self.model, "object": "model", "created": created, "owned_by": "vllm"}
        data = [base | {"root": self.model, "parent": None}]
        data += [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": path,
                "parent": self.model,
            }
            for name, path in adapters.items()
        ]
        self._send_json(h, 200, {"object": "list", "data": data})

    def _load_adapter(self, h: _Handler, body: dict[str, Any]) -> None:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            return self._error(h, 400, "Both 'lora_name' and 'lora_path' must be provided.")
        with self._lock:
            loaded = name in self._adapters and not body.get("load_inplace")
            failing = self._failing_loads.pop(0) if self._failing_loads else None
        if failing is not None:
            return self._error(h, failing, f"Loading lora {name} failed: scripted error ({failing})")
        if loaded:
            return self._error(h, 400, f"The lora adapter '{name}' has already been loaded.")
        if not (Path(path) / "adapter_config.json").is_file():
            return self._error(h, 404, f"Loading lora {name} failed: No adapter found for {path}")
        with self._lock:
            self._adapters[name] = str(Path(path))
        return self._send_text(h, 200, f"Success: LoRA adapter '{name}' added successfully.")

    def _unload_adapter(self, h: _Handler, body: dict[str, Any]) -> None:
        name = body.get("lora_name")
        with self._lock:
            removed = self._adapters.pop(name, None) if isinstance(name, str) else None
        if removed is None:
            return self._error(h, 404, f"The lora adapter '{name}' cannot be found.")
        return self._send_text(h, 200, f"Success: LoRA adapter '{name}' removed successfully.")

    # ---- writing

    def _error(self, h: _Handler, status: int, message: str) -> None:
        error_type = ERROR_TYPES.get(status, "InternalServerError")
        payload = {"object": "error", "message": message, "type": error_type, "param": None, "code": status}
        self._send_json(h, status, payload)

    def _send_json(self, h: _Handler, status: int, payload: Any) -> None:
        self._send(h, status, json.dumps(payload).encode(), "application/json")

    def _send_text(self, h: _Handler, status: int, text: str) -> None:
        self._send(h, status, text.encode(), "text/plain; charset=utf-8")

    def _send(self, h: _Handler, status: int, data: bytes, content_type: str) -> None:
        h.send_response(status)
        h.send_header("content-type", content_type)
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()


def _token_logprob(token: str, alternatives: int, vocab_size: int | None = None) -> dict[str, Any]:
    """One log-prob entry; with `vocab_size`, its token spelled `token_id:<id>` (vLLM's
    return_tokens_as_token_ids)."""
    logprob = logprob_of(token)
    shown = token if vocab_size is None else f"token_id:{token_id_of(token, vocab_size)}"
    entry = {"token": shown, "logprob": logprob, "bytes": list(token.encode())}
    others = [
        {"token": f"{token}{k}", "logprob": logprob - k, "bytes": list(f"{token}{k}".encode())}
        for k in range(1, alternatives)
    ]
    return entry | {"top_logprobs": [dict(entry), *others] if alternatives else []}
