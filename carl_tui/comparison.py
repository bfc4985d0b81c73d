"""Comparing runs: which runs are marked, in which colour, which experiment is followed, and what
the Φ and Rewards panes draw for them. Plain state, no Textual: the app feeds it what the watcher
reads and draws what `plan()` says (colours are indices into the charts' line colours). Importing
it loads no Textual, so it is tested on its own."""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import CompareRun, ExperimentView

# The Rewards pane's two readings of a comparison (`T` switches): series key -> its name.
COMPARE_REWARDS = {"reward": "total", "rewards/task/mean": "task"}


@dataclass(frozen=True)
class Mark:
    """A run marked for comparison: its legend label and its chart colour (an index into the
    chart's line colours); the runs of one experiment arm share the arm's colour."""

    label: str
    color: int
    arm: str | None = None


@dataclass(frozen=True)
class LegendEntry:
    """One row of the comparison's legend: a run's label, colour and latest Φ and reward, as shown."""

    label: str
    color: int
    values: tuple[str, str]


@dataclass(frozen=True)
class ComparePlan:
    """What the charts draw for a comparison: the runs, the highlighted one first (drawn on top),
    each with its colour; the pane titles; the legend; the Φ pane's compact legend (one entry per
    experiment arm, else one per run)."""

    runs: list[CompareRun]
    colors: list[int]
    reward_key: str
    phi_title: str
    rewards_title: str
    legend_header: tuple[str, str]
    legend: list[LegendEntry]
    compact: list[tuple[str, int]] = field(default_factory=list)


class Comparison:
    """The marked runs, their series (from the watcher) and the followed experiment. UI state only:
    nothing of it is stored."""

    def __init__(self, line_colours: int) -> None:
        self.line_colours = line_colours  # how many colours the charts cycle through
        self.marks: dict[int, Mark] = {}  # run id -> mark, in the order marked (the legend's order)
        self.compared: dict[int, CompareRun] = {}  # the marked runs' series, from the watcher
        self.reward_key = "reward"  # or "rewards/task/mean" (`T`)
        self.experiment: ExperimentView | None = None  # the experiment opened as the comparison
        self.cells: dict[tuple[str, int], int] = {}  # (arm, seed) -> the run id marked for it

    @property
    def comparing(self) -> bool:
        """Two or more marks overlay the Φ and reward charts; one mark shows the run alone."""
        return len(self.marks) >= 2

    def wanted(self) -> list[int]:
        """After the marks moved: the runs whose series the watcher should read (the marks, while
        comparing; none otherwise, and the series read so far are dropped)."""
        if not self.comparing:
            self.compared = {}
        return list(self.marks) if self.comparing else []

    # -- marks -------------------------------------------------------------------------------------

    def toggle(self, run_id: int, run_name: str | None) -> None:
        """Mark the run, or unmark it; a run of the followed experiment is labelled by its cell."""
        if run_id in self.marks:
            del self.marks[run_id]
            if not self.marks:
                self.forget_experiment()
            return
        cell = next((key for key, marked in self.cells.items() if marked == run_id), None)
        if cell is not None and self.experiment is not None:
            self.marks[run_id] = Mark(f"{cell[0]} s{cell[1]}", self.arm_color(cell[0]), cell[0])
        else:
            self.marks[run_id] = Mark(run_name or str(run_id), self.free_color())

    def clear(self) -> None:
        self.marks = {}
        self.forget_experiment()

    def toggle_reward(self) -> None:
        self.reward_key = "rewards/task/mean" if self.reward_key == "reward" else "reward"

    def free_color(self) -> int:
        used = {m.color for m in self.marks.values()}
        return next(
            (i for i in range(self.line_colours) if i not in used), len(self.marks) % self.line_colours
        )

    def arm_color(self, arm: str) -> int:
        arms = self.experiment.arms if self.experiment else []
        return (arms.index(arm) if arm in arms else len(arms)) % self.line_colours

    # -- the followed experiment -------------------------------------------------------------------

    def open_experiment(self, experiment: ExperimentView) -> None:
        """Mark exactly the experiment's started runs, labelled `arm s<seed>`, coloured by arm."""
        self.marks = {}
        self.cells = {}
        self.apply_experiment(experiment)

    def apply_experiment(self, experiment: ExperimentView) -> bool:
        """Mark the runs of cells that started since last seen (a cell's retry replaces its old run);
        True when the marks changed."""
        self.experiment = experiment
        changed = False
        for cell in experiment.cells:
            run_id, key = cell["run_id"], (cell["arm"], int(cell["seed"]))
            if run_id is None or self.cells.get(key) == run_id:
                continue
            old = self.cells.get(key)
            if old is not None:
                self.marks.pop(old, None)
            self.cells[key] = run_id
            self.marks[run_id] = Mark(f"{key[0]} s{key[1]}", self.arm_color(key[0]), key[0])
            changed = True
        return changed

    def forget_experiment(self) -> None:
        self.experiment = None
        self.cells = {}

    @property
    def experiment_id(self) -> int | None:
        return self.experiment.id if self.experiment else None

    # -- what the charts draw ----------------------------------------------------------------------

    def plan(self, selected: int | None) -> ComparePlan:
        """The marked runs the watcher has read, the selected one first; titles and legends."""
        order = [run_id for run_id in self.marks if run_id in self.compared]
        if selected in order:  # drawn last, so on top
            order.remove(selected)
            order.insert(0, selected)
        reading = COMPARE_REWARDS[self.reward_key]
        other = next(name for key, name in COMPARE_REWARDS.items() if key != self.reward_key)
        what = f"experiment {self.experiment.name} · " if self.experiment else ""
        legend = []
        for run_id, mark in self.marks.items():
            run = self.compared.get(run_id)
            phi = run.latest("phi/mean") if run else None
            reward = run.latest(self.reward_key) if run else None
            values = ("—" if phi is None else f"{phi:.4f}", "—" if reward is None else f"{reward:+.3f}")
            legend.append(LegendEntry(mark.label, mark.color, values))
        compact: list[tuple[str, int]] = []
        for mark in self.marks.values():
            name = mark.arm or mark.label
            if name not in {seen for seen, _ in compact}:
                compact.append((name, mark.color))
        return ComparePlan(
            runs=[self.compared[run_id] for run_id in order],
            colors=[self.marks[run_id].color for run_id in order],
            reward_key=self.reward_key,
            phi_title=f"Φ coherence · {what}{len(self.marks)} runs compared",
            rewards_title=f"Rewards · {reading} reward per run · T: {other}",
            legend_header=("Φ", reading),
            legend=legend,
            compact=compact,
        )
