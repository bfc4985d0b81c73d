"""Alerts when nobody watches: engine.toml's [alerts], a red run or an agents alarm sent once per cause to a
real local HTTP server (or a command), a failing webhook retried with backoff, and the once-per-cause rule
across a restart; in-process on the engine's alert job, then through a real engine process."""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

from engine import paths
from engine.agents.audit import AuditWriter, Incoming
from engine.agents.events import AlarmEvent
from engine.alerts import Alerts, AlertSettings, load_settings
from engine.alerts.deliver import Delivery, Sender, deliver
from engine.alerts.outbox import RETRY_DELAYS_S, alarm_key, run_key
from engine.coherence.analysis import analyze_run
from engine.control import start_engine, stop_engine
from engine.store import Store

T = TypeVar("T")
SECRET = "sk-ant-api03-abcdefghijklmnopqrstuvwx"


def wait_for(check: Callable[[], T], *, timeout: float = 20.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class Hook:
    """A local webhook: records every POST (when, and its JSON) and answers from a script of statuses
    (then 200)."""

    def __init__(self, statuses: list[int | tuple[int, dict[str, str]]] | None = None) -> None:
        self.statuses = list(statuses or [])  # a status, or (status, headers)
        self.posts: list[tuple[float, dict[str, Any]]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert self.headers["Content-Type"] == "application/json"
                hook.posts.append((time.monotonic(), body))
                status = hook.statuses.pop(0) if hook.statuses else 200
                status, headers = status if isinstance(status, tuple) else (status, {})
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/carl?key={SECRET}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self, cause: str | None = None) -> list[dict[str, Any]]:
        return [b for _, b in self.posts if cause is None or b["cause"] == cause]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def write_settings(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "engine.toml").write_text(text)


# -- engine.toml ------------------------------------------------------------------------------------------


def test_settings_are_read_and_each_bad_value_is_one_line_naming_its_key(tmp_path: Path) -> None:
    assert load_settings(tmp_path)[0].targets == ()  # no file: no alerts, nothing to say
    write_settings(
        tmp_path, '[alerts]\nwebhook = "https://hooks.example.com/x"\ncommand = "notify.sh --urgent"\n'
    )
    settings, problems = load_settings(tmp_path)
    assert problems == [] and settings.targets == ("webhook", "command")
    assert settings.command == ("notify.sh", "--urgent") and settings.timeout_s == 10.0
    write_settings(
        tmp_path,
        '[alerts]\nwebhook = "ftp://secret-host/path"\ncommand = []\ntimeout_s = -1\nurl = "x"\n[other]\n'
        "a = 1\n",
    )
    settings, problems = load_settings(tmp_path)
    assert settings.targets == ()
    assert problems == [
        "engine.toml: other: unknown setting (known: alerts, system, nodes)",
        "engine.toml: alerts.url: unknown setting (known: webhook, command, timeout_s)",
        "engine.toml: alerts.webhook: expected an http:// or https:// URL",
        "engine.toml: alerts.timeout_s: expected seconds, more than 0 and at most 120",
    ]
    assert not any("secret-host" in line for line in problems)  # a webhook's URL is its secret
    write_settings(
        tmp_path, '[alerts]\ncommand = ["notify-send", "carl"]\nwebhook = "https://h/x"\ntimeout_s = 2\n'
    )
    settings, problems = load_settings(tmp_path)
    assert (settings.command, settings.timeout_s, problems) == (("notify-send", "carl"), 2.0, [])
    write_settings(tmp_path, "[alerts\nwebhook = 1")
    settings, problems = load_settings(tmp_path)
    assert settings.targets == () and len(problems) == 1 and problems[0].startswith("engine.toml: ")


# -- the alert job, in process -----------------------------------------------------------------------------


def red_run(store: Store, name: str = "r") -> int:
    """A running run whose loss became NaN at step 3: red, cause "loss"."""
    run_id = store.create_run(name, source_kind="carl", status="running", max_steps=10)
    now = time.time()
    store.add_metrics(run_id, [(1, "loss", 0.5, now), (2, "loss", 0.4, now), (3, "loss", None, now)])
    store.update_run(run_id, last_step=3, last_update=now)
    return run_id


def judge(store: Store, run_id: int) -> dict[int, Any]:
    with store.transaction():
        health = analyze_run(store, run_id)
    assert health is not None
    return {run_id: health}


def pump(alerts: Alerts, until: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    """Tick the job as the engine does until `until` holds."""

    def ticked() -> T:
        alerts.tick()
        return until()

    return wait_for(ticked, timeout=timeout, what=what)


def test_a_failing_webhook_is_retried_with_backoff_then_sent_once(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    hook = Hook(statuses=[500, 500])
    home = Path(store.path).parent
    write_settings(home, f'[alerts]\nwebhook = "{hook.url}"\n')
    run_id = red_run(store, f"run {SECRET}")
    alerts = Alerts(store, home)
    caplog.set_level(logging.INFO, logger="carl.engine.alerts")
    try:
        alerts.runs_judged(judge(store, run_id))
        pump(
            alerts,
            lambda: (
                len(hook.posts) == 3
                and (store.kv(run_key(run_id, "loss")) or {})
                .get("targets", {})
                .get("webhook", {})
                .get("state")
                == "sent"
            ),
            "the third try, and its success recorded",
        )
        (t1, first), (t2, second), (t3, third) = hook.posts
        assert first == second == third  # the same alert, tried three times
        assert (
            t2 - t1 >= RETRY_DELAYS_S[0] - 0.05 and t3 - t2 >= RETRY_DELAYS_S[1] - 0.05
        )  # backoff: 1 s, 2 s
        assert first["run"] == "run [REDACTED:anthropic-key]" and SECRET not in json.dumps(first)
        assert (first["kind"], first["run_id"], first["step"], first["level"]) == ("run", run_id, 3, "red")
        assert (first["cause"], first["reason"]) == ("loss", "loss is not finite at step 3")
        assert (
            first["summary"]
            == f"carl: run 'run [REDACTED:anthropic-key]' turned red at step 3: {first['reason']}"
        )
        assert first["time"].endswith("+00:00") and abs(first["timestamp"] - time.time()) < 60
        entry = store.kv(run_key(run_id, "loss"))
        assert entry["targets"]["webhook"]["tries"] == 3 and entry["targets"]["webhook"]["error"] is None
        logged = [r.getMessage() for r in caplog.records]
        assert sum("the webhook failed (HTTP 500)" in line for line in logged) == 2
        assert any("sent to the webhook" in line for line in logged)
        assert not any(SECRET in line or "127.0.0.1" in line for line in logged)  # nor the URL
        # The run is judged again and again (the engine re-checks running runs): no second alert.
        for _ in range(3):
            alerts.runs_judged(judge(store, run_id))
            alerts.tick()
        assert len(hook.posts) == 3
    finally:
        alerts.close()
        hook.close()


def test_once_per_cause_holds_across_a_restart_and_a_pending_try_resumes(
    tmp_path: Path, store: Store
) -> None:
    hook = Hook(statuses=[503])
    home = Path(store.path).parent
    write_settings(home, f'[alerts]\nwebhook = "{hook.url}"\n')
    run_id = red_run(store)
    first = Alerts(store, home)
    first.runs_judged(judge(store, run_id))
    webhook = lambda: store.kv(run_key(run_id, "loss"))["targets"]["webhook"]  # noqa: E731
    pump(
        first, lambda: webhook()["tries"] == 1 and webhook()["error"] == "HTTP 503", "the first try's failure"
    )
    first.close()  # the engine stops between two tries
    assert store.kv(run_key(run_id, "loss"))["targets"]["webhook"]["state"] == "pending"
    again = Alerts(store, home)  # the next engine
    try:
        again.runs_judged(judge(store, run_id))  # still red: no new alert for the same cause
        pump(again, lambda: len(hook.posts) == 2, "the pending try, resumed")
        pump(
            again, lambda: store.kv(run_key(run_id, "loss"))["targets"]["webhook"]["state"] == "sent", "sent"
        )
        # A second cause of the same run is new: the known point after which the first must not have repeated.
        store.add_metrics(run_id, [(s, "reward", 0.5, time.time()) for s in range(1, 4)])
        store.add_metrics(run_id, [(s, "frac_reward_zero_std", 1.0, time.time()) for s in range(1, 4)])
        again.runs_judged(judge(store, run_id))
        pump(again, lambda: hook.bodies("zero_std"), "the zero_std alert")
        assert [b["cause"] for b in hook.bodies()] == ["loss", "loss", "zero_std"]
    finally:
        again.close()
        hook.close()


def test_an_agents_alarm_runs_the_command_with_the_json_on_stdin(tmp_path: Path, store: Store) -> None:
    home = Path(store.path).parent
    out = tmp_path / "alerts.jsonl"
    script = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')"
    write_settings(home, f"[alerts]\ncommand = {json.dumps([sys.executable, '-c', script, str(out)])}\n")
    old = AlarmEvent(kind="collusion", reason="before alerts were set up", worker_id="w0")
    AuditWriter(store).write([Incoming(old.subject(), old.encode(), 1, "t:1")])
    alerts = Alerts(store, home)
    try:
        alerts.tick()  # the cursor starts at the newest alarm: the history is not sent
        alarms = [
            AlarmEvent(
                kind="reward_hacking", reason=f"PRM high, verifier fails; token={SECRET}", worker_id="w1"
            ),
            AlarmEvent(
                kind="reward_hacking", reason="again", worker_id="w1"
            ),  # the same cause: no second alert
            AlarmEvent(kind="worker_divergence", reason="far from the others", worker_id="w1"),
        ]
        AuditWriter(store).write(
            [Incoming(a.subject(), a.encode(), i + 2, f"t:{i + 2}") for i, a in enumerate(alarms)]
        )
        lines = pump(
            alerts, lambda: out.exists() and len(out.read_text().splitlines()) >= 2 and out.read_text(), "2"
        )
        sent = [json.loads(line) for line in lines.splitlines()]
        assert [(s["kind"], s["cause"], s["worker"], s["level"]) for s in sent] == [
            ("agents", "reward_hacking", "w1", "alarm"),
            ("agents", "worker_divergence", "w1", "alarm"),
        ]
        assert sent[0]["run"] is None and SECRET not in lines and "[REDACTED:" in sent[0]["reason"]
        assert sent[0]["summary"].startswith("carl: agents alarm (reward_hacking) on worker w1: PRM high")
        assert store.kv(alarm_key("reward_hacking", "w1"))["targets"]["command"]["state"] == "sent"
        assert store.kv(alarm_key("collusion", "w0")) is None
    finally:
        alerts.close()


def test_a_failing_command_is_logged_and_given_up_after_the_last_try(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.alerts.outbox as outbox

    monkeypatch.setattr(outbox, "RETRY_DELAYS_S", (0.05, 0.05))  # three tries, quickly
    home = Path(store.path).parent
    script = "import sys; sys.stderr.write('no route to pager\\n'); sys.exit(3)"
    write_settings(home, f"[alerts]\ncommand = {json.dumps([sys.executable, '-c', script])}\n")
    run_id = red_run(store)
    alerts = Alerts(store, home)
    caplog.set_level(logging.INFO, logger="carl.engine.alerts")
    try:
        alerts.runs_judged(judge(store, run_id))
        pump(
            alerts,
            lambda: store.kv(run_key(run_id, "loss"))["targets"]["command"]["state"] == "failed",
            "give up",
        )
        state = store.kv(run_key(run_id, "loss"))["targets"]["command"]
        assert state["tries"] == 3 and state["error"] == "the command exited with status 3: no route to pager"
        assert any(
            "failed 3 times" in r.getMessage() and "giving up" in r.getMessage() for r in caplog.records
        )
    finally:
        alerts.close()


# -- through the engine ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_engine_sends_a_red_run_once_across_a_restart(tmp_path: Path, hook: Hook) -> None:
    home = tmp_path / "carl"
    write_settings(home, f'[alerts]\nwebhook = "{hook.url}"\ntimeout_s = 5\n')
    hook.statuses = [500]
    with Store(paths.db_path(home)) as store:
        run_id = red_run(store)
    try:
        start_engine(home)
        log_file = paths.logs_dir(home) / "engine.log"
        wait_for(
            lambda: "sent to the webhook" in log_file.read_text(), what="the alert, retried once", timeout=30
        )
        stop_engine(home, timeout=10.0)
        log = log_file.read_text()
        assert (
            "alerts go to the webhook" in log
            and "the webhook failed (HTTP 500); try 1, the next in 1s" in log
        )
        assert [b["cause"] for b in hook.bodies()] == ["loss", "loss"] and SECRET not in log
        start_engine(home)
        with Store(paths.db_path(home)) as store:  # a second cause: the known point after the restart
            store.add_metrics(run_id, [(s, "reward", 0.5, time.time()) for s in range(1, 4)])
            store.add_metrics(run_id, [(s, "frac_reward_zero_std", 1.0, time.time()) for s in range(1, 4)])
            store.update_run(run_id, last_update=time.time())
        wait_for(lambda: hook.bodies("zero_std"), what="the second cause's alert", timeout=30)
        assert [b["cause"] for b in hook.bodies()] == ["loss", "loss", "zero_std"]
        assert hook.bodies()[0]["run"] == "r" and hook.bodies()[2]["reason"].startswith("no learning signal")
    finally:
        stop_engine(home, timeout=10.0)


@pytest.mark.slow
def test_a_bad_engine_toml_is_one_line_in_the_log_and_the_engine_goes_on(tmp_path: Path) -> None:
    home = tmp_path / "carl"
    write_settings(home, '[alerts]\nwebhook = "not a url"\n')
    try:
        start_engine(home)
        log = paths.logs_dir(home) / "engine.log"
        wait_for(lambda: "alerts.webhook" in log.read_text(), what="the line naming the key")
        assert "engine.toml: alerts.webhook: expected an http:// or https:// URL" in log.read_text()
        assert "not a url" not in log.read_text()
    finally:
        stop_engine(home, timeout=10.0)


# -- one try: redirects, slow answers, one target never waiting on another ---------------------------------


def test_a_redirected_post_is_a_failed_try_that_says_where_never_followed() -> None:
    elsewhere = Hook()  # where the redirect points: it must hear nothing (urllib sent it a GET, bodiless)
    hook = Hook(statuses=[(302, {"Location": f"{elsewhere.url.split('?')[0]}?token={SECRET}"})])
    try:
        settings = AlertSettings(webhook=hook.url, timeout_s=5.0)
        error = deliver(Delivery("k", "webhook", b'{"cause": "loss"}', settings))
        port = elsewhere.server.server_address[1]
        assert error == (
            f"HTTP 302, a redirect to http://127.0.0.1:{port}/carl: not followed for a POST"
        )  # where it pointed, without its query (a token)
        assert len(hook.posts) == 1 and elsewhere.posts == []
    finally:
        hook.close()
        elsewhere.close()


class DrippingServer:
    """Answers every request `200 OK`, then its body one byte a second, for ever."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by close()
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not self.stop.wait(1.0):
                try:
                    conn.sendall(b"x")
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def test_a_webhook_that_drips_its_answer_fails_within_the_timeout_and_never_holds_the_command(
    tmp_path: Path,
) -> None:
    server = DrippingServer()
    done = tmp_path / "done"
    sender = Sender()
    try:
        settings = AlertSettings(webhook=server.url, command=("sh", "-c", f"cat > {done}"), timeout_s=2.0)
        started = time.monotonic()
        sender.submit(Delivery("slow", "webhook", b"{}", settings))
        sender.submit(Delivery("quick", "command", b'{"cause": "loss"}', settings))
        outcomes: list[Any] = []
        wait_for(lambda: outcomes.extend(sender.done()) or len(outcomes) == 2, timeout=30, what="both tries")
        by_key = {o.key: (o.error, o.target) for o in outcomes}
        assert outcomes[0].key == "quick" and by_key["quick"] == (None, "command")  # it did not wait
        assert by_key["slow"] == ("no whole answer within 2s", "webhook")
        assert time.monotonic() - started < 10  # the whole try bounded by timeout_s, not by the drip
        assert json.loads(done.read_text()) == {"cause": "loss"}
    finally:
        sender.close()
        server.close()
