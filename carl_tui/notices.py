"""Notices (Textual's toasts) that leave when the screen next changes, not on a clock.

A toast that leaves on its own timer repaints the cells under it: ~1-2 KB to the terminal of an idle control
room (the "started the engine" notice, 12 s after start), where nothing else moves. So a notice is shown for
its time and then stays until something else moves anyway: a key, a click, or news drawn from the store (a new
step, an agents event, a command's outcome; not the machine's samples alone, which often change no cell). An
idle screen stays idle, a live one loses the notice at its next step.

The control room's base class: its `notify` is the one every widget and screen calls.
"""

from __future__ import annotations

import time

from textual import events
from textual.app import App
from textual.notifications import Notification, Notify, SeverityLevel

from engine.text import visible

HELD = 86_400.0  # Textual's own timer for a held notice: a day, so it never fires first


class HeldNotices(App[None]):
    """An app whose notices are text and leave with the next change on screen."""

    held: tuple[tuple[Notification, float], ...] = ()  # each notice shown and when its time is up

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every notification (a widget's and a screen's land here too) is text, never markup, with its
        control characters made visible: most quote a run's name, a path or a command's stored result. Its
        time up, it leaves with the next change on screen (see the top). Thread-safe, as Textual's."""
        notice = Notification(visible(message), visible(title), severity, HELD, markup=False)
        due = time.time() + (self.NOTIFICATION_TIMEOUT if timeout is None else timeout)
        self.held = (*self.held, (notice, due))
        self.post_message(Notify(notice))

    def expire_notices(self) -> None:
        """The notices whose time is up leave now (the caller has something else to draw)."""
        held, now = self.held, time.time()
        if not any(due <= now for _, due in held):
            return
        self.held = tuple((notice, due) for notice, due in held if due > now)
        for notice, due in held:
            if due <= now and notice in self._notifications:  # (a click may have closed it already)
                self._unnotify(notice)  # as Textual's toast does when its timer fires: its cells are redrawn

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key | events.MouseDown) and not event.is_forwarded:
            self.expire_notices()
        await super().on_event(event)
