"""`carl-tui --serve`: hostile HTTP requests, sent as raw bytes to a real served control room (one for the
family).

A request is built from hostile parts (method, path, query, the token right, wrong or missing, Host and
Origin, the cookie, websocket upgrade headers, lengths that lie, a huge header, control bytes, bytes that are
not UTF-8), sometimes damaged as bytes. The oracle: no answer is a 5xx (an exception in a handler); the server
still answers a good request at once afterwards (else it hangs); and what it prints (the user's terminal)
holds no traceback and no raw control byte. A websocket upgrade that would pass (the token and the origin
right) is never sent: each one starts a control room process, which is not what this family measures.
"""

from __future__ import annotations

import contextlib
import queue
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from hostile import values as hv
from hostile.oracle import HANG, OK, TRACEBACK, TRACEBACK_TEXT, Outcome
from hostile.runner import Family, Workspace

READ_SECONDS = 0.5  # a server that waits for a body the request promised is not a hung one


@dataclass
class Request:
    data: bytes

    def __repr__(self) -> str:
        return f"Request({self.data[:300]!r}{'...' if len(self.data) > 300 else ''})"


def header_text(draw: st.DrawFn) -> str:
    return hv.storable_text(draw(hv.hostile_text()))[:3000]


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """A request as raw bytes, `{port}` and `{token}` in it filled in when it is sent (the server starts once
    the cases are defined)."""
    port, token = "{port}", "{token}"
    method = draw(
        st.sampled_from(["GET", "GET", "GET", "POST", "HEAD", "OPTIONS", "PUT", "G\x1bT", "", "GET " * 3])
    )
    path = draw(
        st.sampled_from(
            [
                "/",
                "/ws",
                "/static/js/textual.js",
                "/static/",
                "/static/../../../../etc/passwd",
                "/static/%2e%2e/%2e%2e/etc/passwd",
                "/static/js/%00",
                "/download/",
                "/download/x",
                "//",
                "/" + "a" * 10_000,
                "*",
            ]
        )
    )
    if draw(st.integers(0, 3)) == 0:
        path += (
            draw(st.sampled_from(["/", "%", "%ff", "%00", "\x1b[2J", "é", "?", "#"])) + header_text(draw)[:50]
        )
    params = []
    which = draw(st.sampled_from(["right", "right", "wrong", "none", "hostile", "twice"]))
    if which == "right":
        params.append(f"token={token}")
    elif which == "wrong":
        params.append("token=" + "A" * 32)
    elif which == "hostile":
        params.append("token=" + header_text(draw)[:100])
    elif which == "twice":
        params += [f"token={token}", "token=x"]
    if path == "/ws" or draw(st.integers(0, 4)) == 0:
        params += [f"width={draw(st.sampled_from(['80', '-1', '0', '99999999999', 'nan', '1e9', '']))}"]
        params += [f"height={draw(st.sampled_from(['24', '-1', '0', '2147483648', 'x']))}"]
    query = ("?" + "&".join(params)) if params else ""
    version = draw(
        st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9.9", "HTTP/1.1\x00", ""])
    )
    headers = []
    host = draw(st.sampled_from(["right", "right", "localhost", "evil", "none", "twice", "hostile"]))
    if host == "right":
        headers.append(f"Host: 127.0.0.1:{port}")
    elif host == "localhost":
        headers.append(f"Host: localhost:{port}")
    elif host == "evil":
        headers.append(f"Host: evil.example:{port}")
    elif host == "twice":
        headers += [f"Host: 127.0.0.1:{port}", "Host: evil.example"]
    elif host == "hostile":
        headers.append("Host: " + header_text(draw)[:200])
    origin = draw(st.sampled_from(["none", "none", "right", "evil", "null", "hostile", "port"]))
    if origin == "right":
        headers.append(f"Origin: http://127.0.0.1:{port}")
    elif origin == "evil":
        headers.append("Origin: http://evil.example")
    elif origin == "null":
        headers.append("Origin: null")
    elif origin == "port":
        headers.append("Origin: http://127.0.0.1:1")
    elif origin == "hostile":
        headers.append("Origin: " + header_text(draw)[:200])
    if draw(st.integers(0, 3)) == 0:
        cookie = draw(st.sampled_from([token, "x", header_text(draw)[:100]]))
        headers.append(f"Cookie: carl_serve_{port}={cookie}")
    upgrade = path == "/ws" and draw(st.booleans())
    if upgrade and not (which == "right" and origin in ("none", "right") and host in ("right", "localhost")):
        headers += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13"]
        headers.append(
            f"Sec-WebSocket-Key: {draw(st.sampled_from(['dGhlIHNhbXBsZSBub25jZQ==', '', 'x' * 100]))}"
        )
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.integers(0, 4))
        if kind == 0:
            headers.append(
                f"Content-Length: {draw(st.sampled_from(['5', '-1', '99999999999999999999', 'x', '0']))}"
            )
        elif kind == 1:
            headers.append("Transfer-Encoding: chunked")
        elif kind == 2:
            headers.append("X-Big: " + "x" * draw(st.sampled_from([9000, 100_000])))
        elif kind == 3:
            headers.append(header_text(draw)[:100] + ": " + header_text(draw)[:100])
        else:
            headers.append("Accept-Encoding: " + header_text(draw)[:100])
    headers.append(
        draw(st.sampled_from(["Connection: close", "Connection: close", "Connection: keep-alive", ""]))
    )
    body = draw(st.sampled_from([b"", b"", b"zz\r\n", b"5\r\nhello\r\n0\r\n\r\n", b"x" * 100]))
    head = f"{method} {path}{query} {version}\r\n" + "".join(h + "\r\n" for h in headers if h) + "\r\n"
    data = head.encode("utf-8", "replace") + body
    if draw(st.integers(0, 5)) == 0:
        data = draw(hv.mutated_bytes(data))
    return Request(data)


def send(port: int, data: bytes, seconds: float = READ_SECONDS) -> bytes:
    """Send `data` and read the answer until the server closes, a whole answer has come, or `seconds` pass."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as sock:
        with contextlib.suppress(OSError):  # the server may close on a bad request before reading it all
            sock.sendall(data)
        answer = b""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            answer += chunk
            if whole(answer):
                break
    return answer


def whole(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return match is not None and len(body) >= int(match.group(1))


def status_of(answer: bytes) -> int | None:
    match = re.match(rb"HTTP/\d\.\d (\d{3})", answer)
    return int(match.group(1)) if match else None


class Serving:
    """`carl-tui --serve` on the family's home, its printed lines gathered."""

    def __init__(self, ws: Workspace) -> None:
        from test_serve import Served, free_port

        self.served = Served(ws.home, free_port(), [])
        url = self.served.url()
        match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)", url)
        assert match is not None, url
        self.port, self.token = int(match.group(1)), match.group(2)

    def printed(self) -> str:
        lines = []
        with contextlib.suppress(queue.Empty):
            while True:
                lines.append(self.served.lines.get_nowait())
        return "".join(lines)

    def alive(self) -> bool:
        good = (
            f"GET /?token={self.token} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nConnection: close\r\n\r\n"
        )
        for _ in range(3):
            with contextlib.suppress(OSError):
                if status_of(send(self.port, good.encode(), seconds=10)) == 200:
                    return True
            time.sleep(0.5)
        return False


def feed_serve(case: Request, ws: Workspace, where: Path) -> Outcome:
    serving: Serving = ws.context["serving"]
    data = case.data.replace(b"{port}", str(serving.port).encode()).replace(
        b"{token}", serving.token.encode()
    )
    try:
        answer = send(serving.port, data)
    except OSError as exc:
        answer = f"(connection: {exc})".encode()
    status = status_of(answer)
    printed = serving.printed()
    if status is not None and status >= 500:
        return Outcome(TRACEBACK, f"answered {status}: {answer[:500]!r}", printed)
    if TRACEBACK_TEXT in printed:
        return Outcome(TRACEBACK, f"printed a traceback: {printed[-3000:]}", printed)
    if not serving.alive():
        return Outcome(HANG, "the server no longer answers a good request", printed)
    return Outcome(OK, f"{status}", printed)


@contextlib.contextmanager
def serve_context(ws: Workspace) -> Iterator[None]:
    serving = Serving(ws)
    ws.context["serving"] = serving
    try:
        yield
    finally:
        alive = serving.served.stop()
        assert alive == [], "a session's control room outlived the server"


FAMILIES = [
    Family(
        "serve-requests",
        lambda folder: None,
        lambda seeds: requests(),
        feed_serve,
        ci_examples=80,
        context=serve_context,
    ),
]
