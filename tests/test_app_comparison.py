"""Comparing runs without Textual: the marks and their colours, the followed experiment and its arms,
and what the Φ and Rewards charts are told to draw (carl_tui/comparison.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from support import ROOT

from carl_tui.comparison import Comparison
from carl_tui.model import CompareRun, ExperimentView
from engine.store import RunRow, Series

COLOURS = 6


def run(run_id: int, name: str) -> RunRow:
    return RunRow(run_id, name, "carl", None, "finished", 2, 512, 1, None, None, None, None, None)


def compared(run_id: int, name: str, phi: float, reward: float, task: float) -> CompareRun:
    def one(value: float) -> Series:
        steps, values = [0, 1], [value / 2, value]  # raw points, as the reader builds them
        return Series(steps, steps, values, values, values, 1, value, 1)

    series = {"phi/mean": one(phi), "reward": one(reward), "rewards/task/mean": one(task)}
    return CompareRun(run(run_id, name), series)


def experiment(cells: list[tuple[str, int, int | None]]) -> ExperimentView:
    rows = [{"arm": arm, "seed": seed, "run_id": run_id, "status": "finished"} for arm, seed, run_id in cells]
    return ExperimentView(7, "abl", ["task-only", "cascade"], [1, 2], "running", rows)


def test_the_module_loads_no_textual() -> None:
    code = "import json, sys, carl_tui.comparison; print(json.dumps('textual' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) is False


def test_marks_take_free_colours_and_two_make_a_comparison() -> None:
    comparison = Comparison(COLOURS)
    comparison.toggle(3, "gamma")
    assert list(comparison.marks) == [3] and not comparison.comparing
    assert comparison.wanted() == [], "one mark: nothing to read for a comparison"
    comparison.toggle(2, "beta")
    comparison.toggle(1, "alpha")
    assert comparison.comparing and comparison.wanted() == [3, 2, 1]
    assert [m.label for m in comparison.marks.values()] == ["gamma", "beta", "alpha"]
    assert [m.color for m in comparison.marks.values()] == [0, 1, 2]
    comparison.toggle(2, "beta")  # unmarked: its colour is free again, and the next mark takes it
    comparison.toggle(4, "delta")
    assert {run_id: m.color for run_id, m in comparison.marks.items()} == {3: 0, 1: 2, 4: 1}
    comparison.compared = {3: compared(3, "gamma", 0.9, 1.0, 0.5)}
    comparison.toggle(1, "alpha")
    comparison.toggle(4, "delta")
    assert not comparison.comparing and comparison.wanted() == [] and comparison.compared == {}
    comparison.clear()
    assert comparison.marks == {}


def test_the_plan_draws_the_selected_run_on_top_with_a_legend() -> None:
    comparison = Comparison(COLOURS)
    for run_id, name in ((1, "alpha"), (2, "beta"), (3, "gamma")):
        comparison.toggle(run_id, name)
    comparison.compared = {
        1: compared(1, "alpha", 0.8, 1.0, 0.25),
        2: compared(2, "beta", 0.9, -0.5, 0.125),
    }  # gamma's series not read yet
    plan = comparison.plan(selected=2)
    assert [c.run.id for c in plan.runs] == [2, 1] and plan.colors == [1, 0]
    assert plan.reward_key == "reward"
    assert plan.phi_title == "Φ coherence · 3 runs compared"
    assert plan.rewards_title == "Rewards · total reward per run · T: task"
    assert plan.legend_header == ("Φ", "total")
    assert [(e.label, e.color, e.values) for e in plan.legend] == [
        ("alpha", 0, ("0.8000", "+1.000")),
        ("beta", 1, ("0.9000", "-0.500")),
        ("gamma", 2, ("—", "—")),
    ]
    assert plan.compact == [("alpha", 0), ("beta", 1), ("gamma", 2)]
    comparison.toggle_reward()
    plan = comparison.plan(selected=None)
    assert [c.run.id for c in plan.runs] == [1, 2], "no selection among them: the order marked"
    assert plan.reward_key == "rewards/task/mean" and plan.legend_header == ("Φ", "task")
    assert plan.rewards_title == "Rewards · task reward per run · T: total"
    assert plan.legend[0].values == ("0.8000", "+0.250")


def test_an_experiment_marks_its_started_cells_coloured_by_arm() -> None:
    comparison = Comparison(COLOURS)
    comparison.toggle(99, "outside")  # opening an experiment replaces the marks
    comparison.open_experiment(experiment([("task-only", 1, 10), ("task-only", 2, 11), ("cascade", 1, None)]))
    assert list(comparison.marks) == [10, 11] and comparison.experiment_id == 7
    assert [m.label for m in comparison.marks.values()] == ["task-only s1", "task-only s2"]
    assert {m.color for m in comparison.marks.values()} == {0}, "the seeds of an arm share its colour"
    # A cell starts: its run joins in its arm's colour; nothing new, nothing changes.
    assert comparison.apply_experiment(
        experiment([("task-only", 1, 10), ("task-only", 2, 11), ("cascade", 1, 12)])
    )
    assert comparison.marks[12].label == "cascade s1" and comparison.marks[12].color == 1
    assert not comparison.apply_experiment(
        experiment([("task-only", 1, 10), ("task-only", 2, 11), ("cascade", 1, 12)])
    )
    # A retried cell: its new run replaces the old one.
    assert comparison.apply_experiment(
        experiment([("task-only", 1, 10), ("task-only", 2, 13), ("cascade", 1, 12)])
    )
    assert list(comparison.marks) == [10, 12, 13] and comparison.marks[13].label == "task-only s2"
    plan = comparison.plan(selected=12)
    assert plan.phi_title == "Φ coherence · experiment abl · 3 runs compared"
    assert plan.compact == [("task-only", 0), ("cascade", 1)], "one entry per arm"
    # Unmarked and marked again, a cell's run keeps its cell's label and its arm's colour.
    comparison.toggle(13, "abl-task-only-s2")
    comparison.toggle(13, "abl-task-only-s2")
    assert comparison.marks[13].label == "task-only s2" and comparison.marks[13].color == 0
    # The last mark gone, the experiment is no longer followed.
    for run_id in list(comparison.marks):
        comparison.toggle(run_id, None)
    assert comparison.experiment is None and comparison.experiment_id is None and comparison.cells == {}
