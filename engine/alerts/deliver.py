"""Sending one alert: an HTTP POST of its JSON to the webhook, or the command with the JSON on its stdin.

Tries run in a thread of their own (`Sender`), one at a time, so a slow or dead endpoint never holds the
engine's loop; the loop hands tries in and reads outcomes back, and keeps every store write to itself.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

from engine import __version__
from engine.llm.redact import redact

from .config import AlertSettings


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
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"carl/{__version__}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (http/https checked)
            response.read(4096)
    except urllib.error.HTTPError as exc:
        raise DeliveryFailed(f"HTTP {exc.code}") from None
    except urllib.error.URLError as exc:
        raise DeliveryFailed(f"cannot reach it ({_reason(exc.reason)})") from None
    except TimeoutError:
        raise DeliveryFailed(f"no answer within {timeout:g}s") from None
    except OSError as exc:
        raise DeliveryFailed(_reason(exc)) from None


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
    """A daemon thread that makes the tries handed to it, one at a time, and queues their outcomes."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[Delivery | None] = queue.Queue()
        self.outcomes: queue.Queue[Outcome] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="carl-alerts", daemon=True)
        self.thread.start()

    def submit(self, job: Delivery) -> None:
        self.jobs.put(job)

    def done(self) -> list[Outcome]:
        """The outcomes so far, without waiting."""
        out = []
        while True:
            try:
                out.append(self.outcomes.get_nowait())
            except queue.Empty:
                return out

    def close(self, timeout: float = 1.0) -> None:
        self.jobs.put(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            self.outcomes.put(Outcome(job.key, job.target, deliver(job)))
