"""`carl-tui --serve`: the control room in a browser, through textual-serve.

textual-serve's `Server` does the work: an aiohttp app that serves xterm.js and, per browser
session, runs the control room as its own process (Textual's web driver) behind a websocket.
What this module adds around it:
- a token: every request (page, static assets, websocket, downloads) without it gets 403;
  the first good request (`/?token=...`) sets an HttpOnly cookie that the page's own asset and
  websocket requests then carry;
- the socket is bound here, before anything is printed, so a busy port is one line and
  `--port 0` prints the port it got;
- no access log (it would print the token with every request), no banner; one line with the URL;
- the page's URLs are built from the address the browser used, so an SSH tunnel to another
  local port, or `--host 0.0.0.0`, works;
- a request from a page on another origin is refused (403) even with the token: a browser's
  `Origin` must be the address it asked for (or one listed in $CARL_SERVE_ORIGINS, for a reverse
  proxy); and on loopback the `Host` must be a loopback name, so a DNS-rebound name cannot reach it;
- `/static` serves its files and never lists its folder;
- a websocket message that is not what the page sends (not JSON, not a list, a resize without two numbers) is
  dropped with one log line, never a traceback; a terminal size is clamped to what a screen can be, before the
  session starts and at every resize (a 3000x3000 session, or one of 0 rows, spun at 100% and outlived its
  tab);
- a session's process is started in a session of its own and ends with its tab: asked to quit, then
  SIGTERM, then SIGKILL to its whole process group, each after a short wait.
Imported only by `carl-tui --serve` (aiohttp is a slow import; the control room never loads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import ipaddress
import json
import logging
import os
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp_jinja2
import jinja2
from aiohttp import WSMsgType, web
from aiohttp.http_exceptions import HttpProcessingError
from rich.logging import RichHandler
from textual_serve.app_service import AppService
from textual_serve.server import Server

from engine.errors import CarlError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = logging.getLogger("carl.serve")

# A browser's terminal, in cells: what any real screen gives, and no more (a session renders every cell).
MIN_WIDTH, MAX_WIDTH = 10, 500
MIN_HEIGHT, MAX_HEIGHT = 5, 200
MAX_MESSAGE = 64 * 1024  # characters of one websocket message from the page (a paste, a resize)
QUIT_WAIT_S = 5.0  # a session asked to quit gets this long, then SIGTERM, then as long again, then SIGKILL


def clamped_size(width: object, height: object) -> tuple[int, int]:
    """A terminal size the session can take: numbers, each within what a screen can be."""

    def number(value: object, default: int) -> int:
        if isinstance(value, bool):
            return default
        if isinstance(value, int | float) and value == value and abs(value) < 1e9:  # not NaN, not huge
            return int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 10:
            return int(value)
        return default

    return (
        min(max(number(width, 80), MIN_WIDTH), MAX_WIDTH),
        min(max(number(height, 24), MIN_HEIGHT), MAX_HEIGHT),
    )


class Session(AppService):
    """textual-serve's AppService (textual_serve/app_service.py) with its process in a session of its own,
    started without a shell, and always ended with its tab: the quit message, then SIGTERM and SIGKILL to its
    process group (a control room stuck in a render ignored the quit and outlived the tab)."""

    def __init__(self, argv: list[str], **kwargs: object) -> None:
        super().__init__(shlex.join(argv), **kwargs)  # type: ignore[arg-type]
        self.argv = argv

    async def _open_app_process(self, width: int = 80, height: int = 24) -> asyncio.subprocess.Process:
        environment = self._build_environment(width=width, height=height)
        self._process = process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environment,
            start_new_session=True,
        )
        assert process.stdin is not None
        self._stdin = process.stdin
        return process

    async def stop(self) -> None:
        process = self._process
        task = self._task
        with contextlib.suppress(Exception):  # a pipe already closed: the ending below still runs
            await asyncio.wait_for(super().stop(), QUIT_WAIT_S)
        if process is not None and process.returncode is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, sig)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), QUIT_WAIT_S)
                if process.returncode is not None:
                    break
        if task is not None and not task.done():
            task.cancel()
        self._task = None


class ServeError(CarlError):
    """A one-line message for the user (a busy port, an address we cannot listen on)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or one line saying why not."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ServeError(f"cannot listen on {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp's own sites do
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on {host} is already in use (pick another with --port)") from None
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# More origins a browser may come from (a reverse proxy's), comma-separated.
ORIGINS_ENV = "CARL_SERVE_ORIGINS"
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> str | None:
    """`scheme://host:port` of a URL or Origin header, lower-cased with the port written out; None when
    it is not an http(s) origin (`null`, a file: page, garbage)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return None
    if parts.scheme.lower() not in DEFAULT_PORTS or not parts.hostname or port is None:
        return None
    return f"{parts.scheme.lower()}://{url_host(parts.hostname.lower())}:{port}"


def allowed_origins(setting: str | None) -> frozenset[str]:
    """The origins of $CARL_SERVE_ORIGINS; one that is not an origin is one line for the user."""
    origins = set()
    for item in (setting or "").replace(",", " ").split():
        origin = origin_of(item)
        if origin is None:
            raise ServeError(f"${ORIGINS_ENV}: {item!r} is not an origin such as https://carl.example.com")
        origins.add(origin)
    return frozenset(origins)


def refusal(request: web.Request, *, loopback: bool, allowed: Iterable[str]) -> str | None:
    """Why a request cannot be served whatever its token (None: it may be). A browser says where the page
    that makes a request came from (`Origin`, on every websocket and cross-site request): it must be this
    server as the browser addressed it, or an allowed origin. Served on loopback, the address itself must
    be a loopback name: a page whose name was re-pointed at 127.0.0.1 (DNS rebinding) has another."""
    here = origin_of(f"{request.scheme}://{request.host}")
    if here is None:
        return "a request without a usable Host"
    if loopback and not _local_name(urlsplit(here).hostname or "", allowed):
        return f"Host {request.host!r} is not this machine's loopback address"
    origin = request.headers.get("Origin")
    if origin is not None and origin_of(origin) not in (here, *allowed):
        return f"a page on another origin ({origin[:100]!r})"
    return None


def _local_name(name: str, allowed: Iterable[str]) -> bool:
    """A name a browser on this machine may use for a server on loopback: a loopback name or address,
    this machine's own name, or the name of an allowed origin (a reverse proxy passing its Host on)."""
    if is_loopback(name) or name == socket.gethostname().lower():
        return True
    return any(urlsplit(origin).hostname == name for origin in allowed)


class ControlRoomServer(Server):
    """textual-serve's Server, behind a token, on a socket bound beforehand."""

    def __init__(
        self,
        command: str,
        sock: socket.socket,
        token: str,
        *,
        title: str,
        origins: frozenset[str] = frozenset(),
    ) -> None:
        host, port = sock.getsockname()[:2]
        super().__init__(command, host=host, port=port, title=title)
        self.sock = sock
        self.token = token
        self.cookie = f"carl_serve_{port}"  # per server: two on one host keep their own
        self.loopback = is_loopback(host)
        self.origins = origins

    def _authorised(self, request: web.Request) -> bool:
        given = request.query.get("token") or request.cookies.get(self.cookie) or ""
        return hmac.compare_digest(given.encode(), self.token.encode())

    @web.middleware
    async def require_token(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        why = refusal(request, loopback=self.loopback, allowed=self.origins)
        if why is not None:
            raise web.HTTPForbidden(text=f"403: forbidden ({why})\n")
        if not self._authorised(request):
            raise web.HTTPForbidden(text="403: forbidden (the URL carl-tui printed carries the token)\n")
        response = await handler(request)
        if not response.prepared:  # the websocket's headers are gone already; it needs no cookie
            response.headers["Referrer-Policy"] = "no-referrer"  # the token stays off other sites' logs
            if request.query.get("token"):
                response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
        return response

    async def _make_app(self) -> web.Application:
        """textual-serve's app (textual_serve/server.py, `Server._make_app`), with the token and origin
        check in front and a /static that lists no folder (textual-serve asks aiohttp for listings)."""
        app = web.Application(middlewares=[self.require_token])
        aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(self.templates_path))
        app.add_routes(
            [
                web.get("/", self.handle_index, name="index"),
                web.get("/ws", self.handle_websocket, name="websocket"),
                web.get("/download/{key}", self.handle_download, name="download"),
                web.static("/static", self.statics_path, show_index=False, name="static"),
            ]
        )
        app.on_startup.append(self.on_startup)
        app.on_shutdown.append(self.on_shutdown)
        return app

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        # textual-serve writes absolute URLs from public_url into the page; build it from the address
        # the browser used (a tunnel's local port, the machine's name). No await between this and
        # the template's use of it, so concurrent requests cannot mix them up.
        self.public_url = f"{request.scheme}://{request.host}"
        return await super().handle_index(request)

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """textual-serve's websocket (textual_serve/server.py `handle_websocket`) with a session that always
        ends with its tab (`Session`) and a clamped size; a plain GET of /ws, or a handshake aiohttp refuses,
        is answered 400 here (textual-serve would log a traceback for each)."""
        if not web.WebSocketResponse().can_prepare(request).ok:
            raise web.HTTPBadRequest(text="400: not a websocket handshake\n")
        websocket = web.WebSocketResponse(heartbeat=15, max_msg_size=MAX_MESSAGE * 4)
        width, height = clamped_size(request.query.get("width", "80"), request.query.get("height", "24"))
        session: Session | None = None
        try:
            await websocket.prepare(request)
            session = Session(
                shlex.split(self.command),
                write_bytes=websocket.send_bytes,
                write_str=websocket.send_str,
                close=websocket.close,
                download_manager=self.download_manager,
                debug=self.debug,
            )
            await session.start(width, height)
            await self._process_messages(websocket, session)
        except asyncio.CancelledError:
            await websocket.close()
        except Exception as exc:  # one line, never the request's locals (they hold the token)
            log.warning(
                "a browser session ended on an error: %s",
                " ".join(f"{type(exc).__name__}: {exc}".split())[:200],
            )
        finally:
            if session is not None:
                await session.stop()
        return websocket

    async def _process_messages(self, websocket: web.WebSocketResponse, app_service: AppService) -> None:
        """The page's messages to its session (stdin, resize, ping, blur, focus), each checked: one that is
        not what the page sends is dropped with one log line, the session goes on."""
        async for message in websocket:
            if message.type != WSMsgType.TEXT:
                continue
            envelope = _envelope(message.data)
            if envelope is None:
                log.warning("a browser session sent a message that is not one of the page's; dropped")
                continue
            kind, data = envelope
            if kind == "stdin" and isinstance(data, str):
                await app_service.send_bytes(data.encode("utf-8", "replace"))
            elif kind == "resize" and isinstance(data, dict):
                await app_service.set_terminal_size(*clamped_size(data.get("width"), data.get("height")))
            elif kind == "ping" and isinstance(data, str | int | float) and not isinstance(data, bool):
                await websocket.send_json(["pong", data])
            elif kind == "blur":
                await app_service.blur()
            elif kind == "focus":
                await app_service.focus()
            else:
                log.warning("a browser session sent a %r message it cannot send; dropped", kind[:20])

    async def on_startup(self, app: web.Application) -> None:
        """textual-serve prints a banner here; the CLI has printed its one line already."""

    def initialize_logging(self) -> None:
        """textual-serve's logging (textual_serve/server.py), without the locals of a traceback (they hold the
        request, token included), and without a traceback at all for a request aiohttp refused as malformed:
        that is the client's mistake, answered 400, and anyone who can reach the port could fill the terminal
        with it."""
        logging.basicConfig(
            level="INFO",
            format="%(message)s",
            handlers=[RichHandler(show_path=False, show_time=False, console=self.console)],
        )
        logging.getLogger("aiohttp.server").addFilter(drop_client_errors)

    def run(self) -> None:
        """Serve until SIGINT or SIGTERM (aiohttp's handlers end it cleanly, sessions included)."""
        self.initialize_logging()
        web.run_app(self._make_app(), sock=self.sock, print=None, access_log=None, handle_signals=True)


def _envelope(text: object) -> tuple[str, object] | None:
    """`[kind, data]` from a websocket text message, or None when it is not that shape."""
    if not isinstance(text, str) or len(text) > MAX_MESSAGE:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        return None
    return value[0], value[1] if len(value) > 1 else None


def drop_client_errors(record: logging.LogRecord) -> bool:
    """False for aiohttp's log of a request it answered with a 4xx (a malformed request line or header)."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500)


def session_command(home: Path, *, readonly: bool, start_engine: bool, experiment: str | None) -> str:
    """The shell command textual-serve runs per browser session: this control room, on this home."""
    argv = [sys.executable, "-m", "carl_tui", "--home", str(home)]
    if readonly:
        argv.append("--readonly")
    if not start_engine:
        argv.append("--no-engine")
    if experiment is not None:
        argv += ["--experiment", experiment]
    return shlex.join(argv)


def serve(
    home: Path,
    *,
    host: str,
    port: int,
    readonly: bool,
    start_engine: bool = True,
    experiment: str | None = None,
) -> int:
    origins = allowed_origins(os.environ.get(ORIGINS_ENV))
    sock = bind(host, port)
    bound_port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    if not is_loopback(host):
        print(
            f"carl-tui: warning: listening on {host}, not loopback: anyone who can reach it and has the "
            "URL can watch" + ("" if readonly else " and control training"),
            file=sys.stderr,
        )
    mode = "read-only" if readonly else "with control"
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host  # every address: say this one
    print(
        f"carl-tui: serving the control room ({mode}) at http://{url_host(shown)}:{bound_port}/?token={token}",
        flush=True,
    )
    command = session_command(home, readonly=readonly, start_engine=start_engine, experiment=experiment)
    ControlRoomServer(command, sock, token, title="carl control room", origins=origins).run()
    return 0
