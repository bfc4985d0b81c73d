"""The Runs list: newest first, filtered by a regex, a run's state as a mark, and a stripe in its
comparison colour when it is marked (the list doubles as the comparison's legend)."""

from __future__ import annotations

import re
from collections.abc import Callable

from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.widgets import OptionList
from textual.widgets.option_list import Option, OptionDoesNotExist

from engine.store import RunRow
from engine.text import visible_line

from .comparison import Mark
from .model import run_state

MARK = "▌"  # a run marked for comparison, in the Runs list
STATE_MARKS = {
    "live": "●",
    "silent": "◌",
    "presumed crashed": "✕",
    "finished": "✓",
    "failed": "✕",
    "stopped": "■",
    "imported": "·",
}


class RunList(OptionList):
    """Runs, newest first; `j`/`k` move like the arrows, and the panes follow the highlight."""

    BINDINGS = [
        Binding("j", "cursor_down", "Next run", show=False, id="runs.next"),
        Binding("k", "cursor_up", "Previous run", show=False, id="runs.previous"),
        Binding(
            "x", "screen.toggle_mark", "Mark / unmark the run for comparison", show=False, id="runs.mark"
        ),
    ]

    def show(
        self,
        runs: list[RunRow],
        *,
        filter_text: str,
        selected: int | None,
        marks: dict[int, Mark],
        style_of: Callable[[int], Style],
    ) -> None:
        """The runs whose name matches the filter, newest first, the selected one highlighted."""
        shown = list(reversed(visible_runs(runs, filter_text)))
        with self.app.batch_update():
            self.clear_options()
            self.add_options([Option(run_label(r, marks.get(r.id), style_of), id=str(r.id)) for r in shown])
            for index, run in enumerate(shown):
                if run.id == selected:
                    self.highlighted = index
                    break

    def highlight_run(self, run_id: int) -> None:
        """Move the highlight to this run (when the list shows it), so the list agrees with the panes."""
        try:
            index = self.get_option_index(str(run_id))
        except OptionDoesNotExist:
            return
        if self.highlighted != index:
            self.highlighted = index


def visible_runs(runs: list[RunRow], filter_text: str) -> list[RunRow]:
    """The runs whose name matches the filter (a regex, or the literal text when it is not one)."""
    if not filter_text:
        return runs
    try:
        pattern = re.compile(filter_text, re.IGNORECASE)
    except re.error:
        pattern = re.compile(re.escape(filter_text), re.IGNORECASE)
    return [r for r in runs if pattern.search(r.name)]


def run_label(run: RunRow, mark: Mark | None, style_of: Callable[[int], Style]) -> Text:
    """The run's state mark and name, as text (a name is not markup: a str prompt of an OptionList is)."""
    label = f"{STATE_MARKS.get(run_state(run), '·')} {visible_line(run.name)}"
    if mark is None:
        return Text(" " + label)
    # Marked for comparison: a stripe in the run's colour in the first column (the list has no
    # left padding for it).
    return Text.assemble((MARK, style_of(mark.color)), label)
