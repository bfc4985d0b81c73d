"""A model worker's model in a process of its own, beside the worker's bus client.

In one process, the model's Python and the event loop's (the bus client: task, status, result and
acknowledgement messages) take turns for one interpreter lock: the loop's work for each task lands on the
answer's time. In a process of its own, the model computes while the worker's loop talks to the bus, on
another core. The worker asks for the next task's answer as soon as the task arrives (`submit`, while
the answer in hand still goes out), so the model goes from one answer to the next without waiting for the
bus (bench/bench_agents.py).

Requests and replies go over one pipe, in order, each with a ticket. Hot-swaps go the same way, after the
answers already asked for: an answer says which version computed it. The model process ends when the worker
closes it, or when the worker is gone (its end of the pipe closes).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import pickle
import signal
import threading
from pathlib import Path
from typing import Any

from .backends import Answer, WorkerError
from .events import ModelUpdateEvent, TaskEvent
from .plane_settings import AgentsSettings

START_S = 600.0  # loading a large model from disk can take minutes


class ModelProcess:
    """The `model` backend (backends.ModelBackend) run in a child process; the same protocol, plus
    `submit`: ask for a task's answer before the worker takes the task."""

    kind = "model"

    def __init__(self, settings: AgentsSettings, home: Path, *, seed: int = 0) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a process holding sockets and threads
        self.conn, child = context.Pipe()
        self.proc = context.Process(
            target=serve,
            args=(child, settings.model_dump_json(), str(home), seed),
            name="carl-model",
            daemon=True,
        )
        self.proc.start()
        child.close()
        self.sending, self.receiving = threading.Lock(), threading.Lock()
        self.tickets = 0
        self.replies: dict[int, tuple[str, Any, str]] = {}  # replies that came before the one waited for
        self.ahead: dict[str, int] = {}  # task id -> the ticket of its answer, asked for ahead
        self.model, self.version = settings.model, ""
        self._wait(self._send("hello"), timeout=START_S)

    def submit(self, task: TaskEvent) -> None:
        """Ask for `task`'s answer now: the model starts on it as soon as it is done with the one in hand."""
        if task.task_id not in self.ahead:
            self.ahead[task.task_id] = self._send("answer", task)

    def answer(self, task: TaskEvent) -> Answer:
        ticket = self.ahead.pop(task.task_id, None)
        reply: Answer = self._wait(self._send("answer", task) if ticket is None else ticket)
        return reply

    def hot_swap(self, update: ModelUpdateEvent, path: Path) -> str:
        detail: str = self._wait(self._send("hot_swap", update, path))
        return detail

    def close(self) -> None:
        with contextlib.suppress(WorkerError):  # gone already
            self._send("close")
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()

    def _send(self, op: str, *args: Any) -> int:
        with self.sending:
            ticket, self.tickets = self.tickets, self.tickets + 1
            try:
                self.conn.send((ticket, op, args))
            except (OSError, ValueError):
                raise self._gone() from None
        return ticket

    def _wait(self, ticket: int, timeout: float | None = None) -> Any:
        """The reply to `ticket`: its value, or the exception the model raised. Replies come in the order
        asked; those for other tickets are kept for their askers."""
        with self.receiving:
            while ticket not in self.replies:
                try:
                    if timeout is not None and not self.conn.poll(timeout):
                        raise WorkerError(f"the model process did not start in {timeout:.0f}s")
                    got, status, value, version = self.conn.recv()
                except (EOFError, OSError):
                    raise self._gone() from None
                self.replies[got] = (status, value, version)
            status, value, version = self.replies.pop(ticket)
        if version:
            self.version = version
        if status == "error":
            raise value
        return value

    def _gone(self) -> WorkerError:
        self.proc.join(5)
        return WorkerError(f"the model process ended (exit code {self.proc.exitcode})")


def serve(conn: Any, settings_json: str, home: str, seed: int) -> None:
    """The model process: load the model, then answer requests in order until told to close or the
    worker is gone. Its signals are the worker's to handle: a Ctrl-C or a SIGTERM to the process group
    stops the worker, which closes this process once it is done."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from .backends import ModelBackend

    try:
        ticket, _, _ = conn.recv()  # hello
        backend = ModelBackend(AgentsSettings.model_validate_json(settings_json), Path(home), seed=seed)
    except (EOFError, OSError):
        return
    except Exception as exc:  # said by the worker, in one line
        conn.send((ticket, "error", _sendable(exc), ""))
        return
    # As a worker process does once its model is loaded: the imports and the model are set aside from the
    # garbage collector, whose full collections otherwise walk them all (engine/agents/worker.py).
    gc.collect()
    gc.freeze()
    conn.send((ticket, "ok", None, backend.version))
    while True:
        try:
            ticket, op, args = conn.recv()
        except (EOFError, OSError):
            return  # the worker is gone
        if op == "close":
            return
        try:
            conn.send((ticket, "ok", getattr(backend, op)(*args), backend.version))
        except Exception as exc:
            conn.send((ticket, "error", _sendable(exc), backend.version))


def _sendable(exc: Exception) -> Exception:
    """The exception itself when it survives pickling (a CarlError keeps its class: a refusal stays one),
    else a WorkerError with its message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return WorkerError(" ".join(str(exc).split())[:300] or type(exc).__name__)
    return exc
