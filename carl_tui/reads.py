"""Short reads of the store the watcher does not make (a trajectory, an agent task, a run's samples,
the experiments): each runs in a thread worker on a reader of its own and comes back to the UI
thread as a message, so a slow disk or a busy store never stalls a keypress (Harlequin's rule:
workers never touch widgets, they post messages)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from textual.app import App
from textual.message import Message

from .shown_errors import ONE_LINE

if TYPE_CHECKING:
    from engine.store import StoreReader


T = TypeVar("T")


class StoreReads:
    class Done(Message):
        """A read finished: `then(result)` runs on the UI thread."""

        def __init__(self, result: Any, then: Callable[[Any], object]) -> None:
            super().__init__()
            self.result = result
            self.then = then

    class Failed(Message):
        def __init__(self, title: str, error: str) -> None:
            super().__init__()
            self.title = title
            self.error = error

    def __init__(self, app: App[Any], db_path: Path) -> None:
        self.app = app
        self.db_path = db_path

    def read(
        self, read: Callable[[StoreReader], T], then: Callable[[T | None], object], *, title: str
    ) -> None:
        """Run `read` on a reader of its own in a thread; `then` gets its result (None when there is
        no store yet); a failure is one notification titled `title`."""
        self.app.run_worker(
            lambda: self._read(read, then, title),
            thread=True,
            group="reads",
            description=f"read {title}",
        )

    def _read(self, read: Callable[[StoreReader], T], then: Callable[[T | None], object], title: str) -> None:
        from engine.store import StoreReader

        try:
            result: T | None = None
            if self.db_path.exists():
                reader = StoreReader(self.db_path)
                try:
                    result = read(reader)
                finally:
                    reader.close()
        except ONE_LINE as exc:  # an unreadable store: one line, the control room stays up
            self.app.post_message(self.Failed(title, str(exc)))
            return
        self.app.post_message(self.Done(result, then))
