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
  local port, or `--host 0.0.0.0`, works.
Imported only by `carl-tui --serve` (aiohttp is a slow import; the control room never loads it).
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import secrets
import shlex
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from textual_serve.server import Server

from engine.errors import CarlError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


class ControlRoomServer(Server):
    """textual-serve's Server, behind a token, on a socket bound beforehand."""

    def __init__(self, command: str, sock: socket.socket, token: str, *, title: str) -> None:
        host, port = sock.getsockname()[:2]
        super().__init__(command, host=host, port=port, title=title)
        self.sock = sock
        self.token = token
        self.cookie = f"carl_serve_{port}"  # per server: two on one host keep their own

    def _authorised(self, request: web.Request) -> bool:
        given = request.query.get("token") or request.cookies.get(self.cookie) or ""
        return hmac.compare_digest(given.encode(), self.token.encode())

    @web.middleware
    async def require_token(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._authorised(request):
            raise web.HTTPForbidden(text="403: forbidden (the URL carl-tui printed carries the token)\n")
        response = await handler(request)
        if not response.prepared:  # the websocket's headers are gone already; it needs no cookie
            response.headers["Referrer-Policy"] = "no-referrer"  # the token stays off other sites' logs
            if request.query.get("token"):
                response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
        return response

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self.require_token)
        return app

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        # textual-serve writes absolute URLs from public_url into the page; build it from the address
        # the browser used (a tunnel's local port, the machine's name). No await between this and
        # the template's use of it, so concurrent requests cannot mix them up.
        self.public_url = f"{request.scheme}://{request.host}"
        return await super().handle_index(request)

    async def on_startup(self, app: web.Application) -> None:
        """textual-serve prints a banner here; the CLI has printed its one line already."""

    def run(self) -> None:
        """Serve until SIGINT or SIGTERM (aiohttp's handlers end it cleanly, sessions included)."""
        self.initialize_logging()
        web.run_app(self._make_app(), sock=self.sock, print=None, access_log=None, handle_signals=True)


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
    ControlRoomServer(command, sock, token, title="carl control room").run()
    return 0
