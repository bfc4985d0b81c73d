"""`carl-tui --serve`: the control room in a real headless Chromium, through textual-serve.

The server runs as its own process on a free port with a temp home; Chromium (Debian's, driven
by playwright through `executable_path`) opens the printed URL; the terminal's text is read
from xterm.js's own buffer in the page. Without a Chromium executable the browser test skips.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from carl_tui.launch import tui_main
from engine.store import Store

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_NAMES = (
    "chromium-headless-shell",
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
)

# xterm.js keeps its Terminal in textual.js's closure. Its public Terminal object is the one that
# sets `_core` and has `loadAddon`: catch it as it is built, so the test can read its buffer.
CATCH_TERMINAL = """
Object.defineProperty(Object.prototype, "_core", {
  configurable: true,
  set(value) {
    Object.defineProperty(this, "_core", {value, writable: true, configurable: true, enumerable: true});
    if (typeof this.loadAddon === "function") window.__carlTerminal = this;
  },
});
"""
SCREEN_TEXT = """() => {
  const terminal = window.__carlTerminal;
  if (!terminal) return "";
  const buffer = terminal.buffer.active, lines = [];
  for (let y = 0; y < buffer.length; y++) lines.push(buffer.getLine(y).translateToString(true));
  return lines.join("\\n");
}"""


def find_chromium() -> str | None:
    if path := os.environ.get("CARL_CHROMIUM"):
        return path
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status_of(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home whose store holds one run with Φ rising from 0.1 to 0.9 over 50 steps."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Store(home / "carl.db") as store:
        run_id = store.create_run(
            "served-run", source_kind="jsonl", status="running", max_steps=100, vocab_size=512
        )
        now = time.time()
        rows = []
        for step in range(50):
            phi = 0.1 + 0.8 * step / 49
            rows += [
                (step, "phi/mean", phi, now),
                (step, "phi/entropy", (1 - phi) * 6.24, now),
                (step, "rewards/task/mean", 0.5, now),
                (step, "reward", 0.5, now),
            ]
        store.add_metrics(run_id, rows)
    return home


class Served:
    """`carl-tui --serve` as a process: its printed lines arrive on a queue, read by a thread."""

    def __init__(self, home: Path, port: int, extra: list[str], *, engine: bool = False) -> None:
        self.argv = argv = [
            sys.executable,
            "-m",
            "carl_tui",
            "--serve",
            "--port",
            str(port),
            "--home",
            str(home),
            *([] if engine else ["--no-engine"]),
            *extra,
        ]
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def url(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.proc.poll() is None, f"the server exited: {''.join(self.seen)}"
                continue
            self.seen.append(line)
            if match := re.search(r"http://\S+", line):
                return match.group(0)
        raise AssertionError(f"no URL printed in {timeout:.0f}s: {''.join(self.seen)}")

    def output(self) -> str:
        """Everything it printed, once it has exited."""
        self.reader.join(timeout=10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)

    def stop(self) -> list[psutil.Process]:
        """SIGTERM, as a user's Ctrl+C would; returns the session processes still alive 15 s later."""
        try:
            sessions = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            sessions = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        _, alive = psutil.wait_procs(sessions, timeout=15)
        for process in alive:  # the test reports them; they must not outlive it
            process.kill()
        return alive


@pytest.fixture
def served(home: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    server = Served(home, free_port(), getattr(request, "param", []))
    try:
        yield server
    finally:
        server.stop()


def screen_text(page: object) -> str:
    return page.evaluate(SCREEN_TEXT)  # type: ignore[attr-defined]


def wait_for_screen(page: object, *needles: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = screen_text(page)
        if all(needle in text for needle in needles):
            return text
        time.sleep(0.1)
    shows = text or "nothing: no xterm.js Terminal was caught (has textual-serve's textual.js changed?)"
    raise AssertionError(f"{needles} not on the browser's terminal in {timeout:.0f}s; it shows:\n{shows}")


@pytest.fixture
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip(
            f"no Chromium executable found (looked for {', '.join(CHROMIUM_NAMES)} and $CARL_CHROMIUM)"
        )
    return path


def launch(playwright: Any, chromium: str, where: Path) -> Any:
    """Chromium with a home of the test's own: its profile, crash reports and caches stay in `where` (issue 30
    §13: the suite left a `~/.config/chromium` behind), and without the background traffic this machine's
    closed network refuses."""
    home = where / "chromium-home"
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }
    args = [
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    args += ["--disable-breakpad", "--disable-crash-reporter"]
    return playwright.chromium.launch(executable_path=chromium, env=env, args=args)


@pytest.mark.slow
@pytest.mark.parametrize(
    "served", [[], ["--allow-control"]], ids=["read-only", "allow-control"], indirect=True
)
def test_the_control_room_in_a_browser(chromium: str, served: Served) -> None:
    from playwright.sync_api import sync_playwright

    control = "--allow-control" in served.argv

    url = served.url()
    base, token = re.fullmatch(r"(http://127\.0\.0\.1:\d+)/\?token=([\w-]+)", url).groups()  # type: ignore[union-attr]
    # Without the token, or with a wrong one: 403 and nothing of the app.
    for path in ("/", "/?token=wrong", "/static/js/textual.js", "/static/", "/ws?width=80&height=24"):
        code, body = status_of(base + path)
        assert code == 403 and "xterm" not in body and "<html" not in body, path
    # The page's URLs follow the address the browser used (a tunnel's port, another name).
    code, body = status_of(url.replace("127.0.0.1", "localhost"))
    assert code == 200 and f"ws://localhost:{base.rsplit(':', 1)[1]}/ws" in body

    with sync_playwright() as playwright:
        browser = launch(playwright, chromium, Path(served.argv[served.argv.index("--home") + 1]).parent)
        try:
            page = browser.new_page()
            page.route(
                re.compile(r"^https?://(?!127\.0\.0\.1)"), lambda route: route.abort()
            )  # offline: no web fonts
            page.add_init_script(CATCH_TERMINAL)
            page.goto(url, wait_until="domcontentloaded")
            # The Φ pane of the stored run, and the footer: the training keys only with --allow-control.
            text = wait_for_screen(
                page, "Φ coherence 0.9000", "served-run", "Observe" if control else "q Quit"
            )
            assert "Rewards" in text
            assert ("read-only" in text, "Pause" in text) == (not control, control)
            page.focus("textarea.xterm-helper-textarea")  # the keyboard goes to the terminal
            page.keyboard.press("?")
            wait_for_screen(page, "Keys", "Control room", "Held-out eval")
        finally:
            browser.close()
    assert served.stop() == [], "a session's control room outlived the server"
    assert served.proc.returncode == 0 and served.output().count(token) == 1, "the token is printed once"


@pytest.mark.slow
def test_a_read_only_browser_session_starts_no_engine(chromium: str, home: Path) -> None:
    """Served without --no-engine: a read-only session still starts nothing, and says how to."""
    from playwright.sync_api import sync_playwright

    from engine.control import engine_status, stop_engine

    served = Served(home, free_port(), [], engine=True)
    try:
        url = served.url()
        with sync_playwright() as playwright:
            browser = launch(playwright, chromium, home.parent)
            try:
                page = browser.new_page()
                page.route(re.compile(r"^https?://(?!127\.0\.0\.1)"), lambda route: route.abort())
                page.add_init_script(CATCH_TERMINAL)
                page.goto(url, wait_until="domcontentloaded")
                # The session's first look at the engine: down, and the notice says how to start it.
                wait_for_screen(page, "served-run", "engine ✕ down", "watch-only", "read-only")
            finally:
                browser.close()
        assert engine_status(home).state == "down" and not (home / "engine.pid").exists()
    finally:
        assert served.stop() == []
        stop_engine(home)


def test_serve_on_a_busy_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [sys.executable, "-m", "carl_tui", "--serve", "--port", str(port), "--home", str(tmp_path)]
        out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and str(port) in out.stderr and "in use" in out.stderr


def test_serve_without_textual_serve_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CARL_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "textual_serve", None)  # what find_spec sees when it is not installed
    assert tui_main(["--serve", "--home", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "carl-tui[serve]" in err


def test_host_and_port_go_with_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CARL_HOME", str(tmp_path))
    assert tui_main(["--port", "8000", "--home", str(tmp_path)]) == 2
    assert "--serve" in capsys.readouterr().err


def _status_with(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


async def _handshake(url: str, origin: str) -> int:
    """The status of a websocket handshake from a page on `origin` (101: connected)."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(url, headers={"Origin": origin}) as ws:
                await ws.close()
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


@pytest.mark.slow
def test_another_origin_is_refused_even_with_the_token_and_static_lists_nothing(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 §10: the websocket did not check `Origin`, so a page on another site could connect with
    a stolen token, and /static listed its folder. Real HTTP and websocket requests: a page on another
    origin (or a DNS-rebound name for 127.0.0.1) gets 403 whatever its token; the server's own origin
    and one allowed in $CARL_SERVE_ORIGINS get through; /static serves files and lists nothing."""
    import asyncio

    monkeypatch.setenv("CARL_SERVE_ORIGINS", "https://carl.example.com")
    served = Served(home, free_port(), [])
    try:
        url = served.url()
        base, token = re.fullmatch(r"(http://127\.0\.0\.1:(\d+))/\?token=([\w-]+)", url).group(1, 3)  # type: ignore[union-attr]
        port = base.rsplit(":", 1)[1]

        code, body = status_of(f"{base}/static/?token={token}")
        assert code == 403 and "Index of" not in body and "textual.js" not in body
        code, body = status_of(f"{base}/static/js/?token={token}")
        assert code == 403 and "textual.js" not in body
        assert status_of(f"{base}/static/js/textual.js?token={token}")[0] == 200

        page = f"{base}/?token={token}"
        assert _status_with(page, {"Origin": "http://evil.example"}) == 403
        assert _status_with(page, {"Origin": "null"}) == 403
        assert _status_with(page, {"Host": f"evil.example:{port}"}) == 403  # a rebound name, no Origin
        assert (
            _status_with(page, {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"})
            == 403
        )
        assert _status_with(page, {"Origin": base}) == 200
        assert _status_with(page, {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}) == 200
        assert _status_with(page, {"Origin": "https://carl.example.com"}) == 200  # the allow-list

        ws = f"ws://127.0.0.1:{port}/ws?token={token}&width=80&height=24"
        assert asyncio.run(_handshake(ws, "http://evil.example")) == 403
        assert asyncio.run(_handshake(ws, f"http://127.0.0.1:{int(port) + 1}")) == 403  # another port
        assert asyncio.run(_handshake(ws, base)) == 101
    finally:
        assert served.stop() == [], "a session's control room outlived the server"
    assert "Traceback" not in served.output()


def test_a_bad_allowed_origin_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "CARL_SERVE_ORIGINS": "carl.example.com"}
    argv = [
        sys.executable,
        "-m",
        "carl_tui",
        "--serve",
        "--port",
        "0",
        "--home",
        str(tmp_path),
        "--no-engine",
    ]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "CARL_SERVE_ORIGINS" in out.stderr, out.stderr


async def _bad_session(url: str, origin: str, messages: list[str]) -> None:
    """A websocket session that sends `messages`, each answered or dropped, then a ping, then closes."""
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(url, headers={"Origin": origin}) as ws:
        for message in messages:
            await ws.send_str(message)
        await ws.send_str('["ping", "still-here"]')
        async for reply in ws:  # the session answers the ping after every bad message: it went on
            if reply.type == aiohttp.WSMsgType.TEXT and "still-here" in reply.data:
                break
        await ws.close()


@pytest.mark.slow
def test_bad_websocket_messages_and_sizes_never_leave_a_session_behind(home: Path) -> None:
    """Issue 30 §8: with a valid token, malformed messages printed tracebacks on the server's terminal, and a
    resize to 0 before the app started, or to 3000x3000, left the session's process alive (100% CPU) after its
    tab closed. Real websocket sessions: each bad message is dropped with one line, sizes are clamped, and
    every session's process ends when its socket closes."""
    import asyncio

    served = Served(home, free_port(), [])
    try:
        url = served.url()
        base, token = re.fullmatch(r"(http://127\.0\.0\.1:\d+)/\?token=([\w-]+)", url).group(1, 2)  # type: ignore[union-attr]
        ws = base.replace("http://", "ws://") + f"/ws?token={token}"
        server = psutil.Process(served.proc.pid)
        bad = [
            "not json",
            "{}",
            "[]",
            "[1, 2]",
            '["resize"]',
            '["resize", {"width": "x", "height": null}]',
            '["resize", {"width": 3000, "height": 3000}]',
            '["resize", {"width": -4, "height": 0}]',
            '["stdin", 42]',
            '["ping", {"a": 1}]',
            '["nonsense", 1]',
            "[" * 5000 + "]" * 5000,
            '["stdin", "' + "x" * 300_000 + '"]',
        ]
        asyncio.run(_bad_session(f"{ws}&width=0&height=-5", base, bad))  # a size of nothing, before it starts
        asyncio.run(_bad_session(f"{ws}&width=3000&height=3000", base, ['["resize", {"width": 1e308}]']))

        def sessions() -> list[psutil.Process]:
            return [p for p in server.children(recursive=True) if p.is_running() and p.status() != "zombie"]

        deadline = time.monotonic() + 30
        while sessions() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sessions() == [], "a session's process outlived its tab"
    finally:
        assert served.stop() == []
    output = served.output()
    assert "Traceback" not in output
    assert "a browser session sent a message that is not one of the page's; dropped" in output
