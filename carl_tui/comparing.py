"""Comparing runs from the keyboard: `x` marks the highlighted run, `X` clears the marks, `T` switches
the reward drawn, `E` (or `carl-tui --experiment NAME`) opens an experiment's runs as a comparison.
The state is the plain Comparison (carl_tui/comparison.py); this draws it and keeps the watcher
reading the marked runs and the followed experiment.

A mixin of the control room (its actions are the app's); `self` is the ControlRoom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .model import ExperimentView, find_experiment
from .panes import draw_comparison, draw_run

if TYPE_CHECKING:
    from .app import ControlRoom


class ComparingRuns:
    def draw_compare(self: ControlRoom) -> None:
        """Overlay the marked runs (one colour per run, per arm for an experiment), the highlighted
        run on top, a legend with each run's latest values."""
        if self.comparison.comparing:
            draw_comparison(self.main, self.comparison.plan(self.selected))

    def marks_changed(self: ControlRoom) -> None:
        """Marks moved: the watcher reads the marked runs (only while two or more are marked), the
        list shows the marks, and the panes switch between one run and the comparison."""
        self.watcher.compare(self.comparison.wanted())
        self.watcher.follow_experiment(self.comparison.experiment_id)
        comparing = self.comparison.comparing
        self.main.query_one("#rewards-pane").set_class(comparing, "-compare")
        self.fill_run_list()
        if comparing:
            self.draw_compare()
        elif self.view is not None:
            draw_run(self.main, self.view, comparing=False)

    def action_toggle_mark(self: ControlRoom) -> None:
        option = self.run_list.highlighted_option
        if option is None or option.id is None:
            return
        run_id = int(option.id)
        run = next((r for r in self.runs if r.id == run_id), None)
        self.comparison.toggle(run_id, run.name if run else None)
        self.marks_changed()

    def action_clear_marks(self: ControlRoom) -> None:
        if not self.comparison.marks:
            return
        self.comparison.clear()
        self.marks_changed()

    def action_toggle_compare_reward(self: ControlRoom) -> None:
        if not self.comparison.comparing:
            self.notify("mark two or more runs with x (in the Runs list) to compare them", title="compare")
            return
        self.comparison.toggle_reward()
        self.draw_compare()

    # -- experiments ----------------------------------------------------------------------------------

    def action_open_experiment(self: ControlRoom) -> None:
        self.reads.read(lambda reader: reader.experiments(), self.choose_experiment, title="experiments")

    def choose_experiment(self: ControlRoom, experiments: list[dict] | None) -> None:
        if not experiments:
            self.notify("no experiments in the store yet", title="experiments")
            return
        from .screens import ChoiceScreen

        choices = [
            (
                str(e["id"]),
                f"{e['name']} · {', '.join(e['arms'])} × seeds "
                f"{', '.join(map(str, e['seeds']))} · {e['status']}",
            )
            for e in reversed(experiments)
        ]
        self.push_screen(
            ChoiceScreen("Experiments", "Compare the runs of which experiment?", choices),
            lambda chosen: self.open_experiment(int(chosen)) if chosen else None,
        )

    def open_experiment(self: ControlRoom, ref: str | int) -> None:
        """Mark exactly the runs of an experiment (by name, or id), labelled `arm s<seed>` and
        coloured by arm, and follow it: cells that start later join the comparison."""
        self.reads.read(
            lambda reader: find_experiment(reader, ref),
            lambda experiment: self.experiment_found(ref, experiment),
            title="experiment",
        )

    def experiment_found(self: ControlRoom, ref: str | int, experiment: ExperimentView | None) -> None:
        if experiment is None:
            self.notify(
                f"no experiment named {ref!r} in {self.db_path}",
                title="experiment",
                severity="error",
                timeout=10,
            )
            return
        self.comparison.open_experiment(experiment)
        self.marks_changed()
        if not self.comparison.marks:
            self.notify(
                f"experiment {experiment.name}: no run has started yet", title="experiment", markup=False
            )

    def experiment_updated(self: ControlRoom, experiment: ExperimentView) -> None:
        """The followed experiment moved (a cell started): its new runs join the comparison."""
        if self.comparison.apply_experiment(experiment):
            self.marks_changed()
        elif self.comparison.comparing:
            self.draw_compare()  # the experiment's name may show in the title
