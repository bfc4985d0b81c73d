"""Sending one alert: an HTTP POST of its JSON to the webhook, or the command with the JSON on its stdin.

Tries run in threads of their own (`Sender`), one thread per target, so a slow or dead webhook never holds the
engine's loop nor the command's alerts (and the other way round); the loop hands tries in and reads outcomes
back, and keeps every store write to itself.

A try is bounded as a whole by `timeout_s`: the POST runs under one deadline (httpx on asyncio, cancelled when
it passes), so a server that answers 200 and then drips a byte a second fails the try instead of holding the
sender for an hour. A redirect is not followed: a 3xx answer is a failed try that says where it pointed
(urllib turned a POST redirected by 302 into a GET without its body, to wherever it was sent, and called it
delivered).
"""

from __future__ import annotations

import asyncio
import queue
import subprocess
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from engine import __version__
from engine.redact import redact

from .alert_settings import AlertSettings

ANSWER_BYTES = 4096  # of the webhook's answer read at most: its status is what counts


@dataclass(frozen=True)
class Delivery:
    key: str  # the alert's kv key (outbox.py)
    target: str  # webhook | command
    body: bytes  # the alert as JSON
    settings: AlertSettings


@dataclass(frozen=True)
class Outcome:
    key: str
    target: str
    error: str | None  # None: delivered


class DeliveryFailed(Exception):
    """One line saying why a try failed; never the webhook's URL."""


def post_json(url: str, body: bytes, timeout: float) -> None:
    """POST `body` to `url` within `timeout` seconds in all; DeliveryFailed says why not."""
    try:
        asyncio.run(asyncio.wait_for(_post(url, body, timeout), timeout))
    except TimeoutError:
        raise DeliveryFailed(f"no whole answer within {timeout:g}s") from None


async def _post(url: str, body: bytes, timeout: float) -> None:
    headers = {"Content-Type": "application/json", "User-Agent": f"carl/{__version__}"}
    try:
        async with (
            httpx.AsyncClient(follow_redirects=False, timeout=timeout) as client,
            client.stream("POST", url, content=body, headers=headers) as response,
        ):
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read >= ANSWER_BYTES:
                    break
    except httpx.TimeoutException:
        raise DeliveryFailed(f"no answer within {timeout:g}s") from None
    except httpx.HTTPError as exc:
        raise DeliveryFailed(f"cannot reach it ({_reason(exc) or type(exc).__name__})") from None
    except OSError as exc:
        raise DeliveryFailed(_reason(exc)) from None
    if response.is_redirect:
        where = _where(response.headers.get("location", ""))
        raise DeliveryFailed(f"HTTP {response.status_code}, a redirect to {where}: not followed for a POST")
    if response.status_code >= 400:
        raise DeliveryFailed(f"HTTP {response.status_code}")
    if response.status_code >= 300:
        raise DeliveryFailed(f"HTTP {response.status_code}: not a delivery")


def _where(location: str) -> str:
    """A redirect's target as a person can check it: scheme, host and path, never its query (a token)."""
    try:
        parts = urlsplit(location.strip())
    except ValueError:
        return "an address that cannot be read"
    if not parts.netloc:
        return redact(parts.path[:200]) or "nowhere (no Location)"
    return redact(f"{parts.scheme}://{parts.netloc}{parts.path}"[:200])


def run_command(argv: tuple[str, ...], body: bytes, timeout: float) -> None:
    try:
        done = subprocess.run(list(argv), input=body, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise DeliveryFailed(f"command not found: {argv[0]}") from None
    except subprocess.TimeoutExpired:
        raise DeliveryFailed(f"the command did not finish within {timeout:g}s") from None
    except OSError as exc:
        raise DeliveryFailed(f"cannot run the command ({_reason(exc)})") from None
    if done.returncode != 0:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        said = f": {redact(lines[-1])[:200]}" if lines else ""
        raise DeliveryFailed(f"the command exited with status {done.returncode}{said}")


def _reason(value: object) -> str:
    return " ".join(str(value).split())[:200] or type(value).__name__


def deliver(job: Delivery) -> str | None:
    """One try; None when delivered, else why not."""
    try:
        if job.target == "webhook" and job.settings.webhook:
            post_json(job.settings.webhook, job.body, job.settings.timeout_s)
        elif job.target == "command" and job.settings.command:
            run_command(job.settings.command, job.body, job.settings.timeout_s)
        else:
            return f"no {job.target} is configured any more"
    except DeliveryFailed as exc:
        return str(exc)
    except Exception as exc:  # a bug here must not kill the sender
        return f"{type(exc).__name__}: {_reason(exc)}"
    return None


class Sender:
    """The threads that make the tries handed to them: one per target, each one try at a time, so a slow
    webhook never delays the command's alerts; the outcomes of all come back on one queue."""

    def __init__(self) -> None:
        self.outcomes: queue.Queue[Outcome] = queue.Queue()
        self.lanes: dict[str, tuple[queue.Queue[Delivery | None], threading.Thread]] = {}

    def submit(self, job: Delivery) -> None:
        if job.target not in self.lanes:
            jobs: queue.Queue[Delivery | None] = queue.Queue()
            thread = threading.Thread(
                target=self._run, args=(jobs,), name=f"carl-alerts-{job.target}", daemon=True
            )
            thread.start()
            self.lanes[job.target] = (jobs, thread)
        self.lanes[job.target][0].put(job)

    def done(self) -> list[Outcome]:
        """The outcomes so far, without waiting."""
        out = []
        while True:
            try:
                out.append(self.outcomes.get_nowait())
            except queue.Empty:
                return out

    def close(self, timeout: float = 1.0) -> None:
        for jobs, _ in self.lanes.values():
            jobs.put(None)
        for _, thread in self.lanes.values():
            thread.join(timeout)

    def _run(self, jobs: queue.Queue[Delivery | None]) -> None:
        while (job := jobs.get()) is not None:
            self.outcomes.put(Outcome(job.key, job.target, deliver(job)))
