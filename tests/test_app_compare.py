"""Comparing runs in the control room: `x` marks runs in the Runs list, two or more marks overlay
their Φ and rewards (one colour per run, a legend), `--experiment NAME` opens an experiment's runs
that way (coloured by arm). Real store files, the real app through Pilot."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
from support import series, until
from test_app_control import settled

from carl_tui.app import ControlRoom
from carl_tui.launch import tui_main
from carl_tui.runs import MARK, RunList
from engine.store import Store
from widgets.chart import Chart
from widgets.legend import Legend
from widgets.reward_bars import RewardBars

V = 512


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def make_run(store: Store, name: str, steps: int, phi_end: float, reward_end: float) -> int:
    """A finished run with per-step Φ statistics, a total reward and a task reward of its own shape."""
    run_id = store.create_run(name, source_kind="carl", status="finished", max_steps=steps, vocab_size=V)
    now = time.time()
    stats, rows = [], []
    for s in range(steps):
        t = s / (steps - 1)
        phi = 0.5 + (phi_end - 0.5) * t
        stats.append(
            {
                "step": s,
                "phi_mean": phi,
                "phi_p10": phi - 0.05,
                "phi_p90": phi + 0.02,
                "entropy_mean": (1 - phi) * math.log(V),
                "wall_time": now,
            }
        )
        rows += [
            (s, "reward", reward_end * t, now),
            (s, "rewards/task/mean", reward_end * t / 2, now),
            (s, "rewards/format/mean", 0.5, now),
        ]
    store.add_phi_stats(run_id, stats)
    store.add_metrics(run_id, rows)
    return run_id


def drawn(chart: Chart, index: int) -> dict[int, float]:
    """What the chart draws as line `index`: its buckets' means by step (raw points here)."""
    line = chart.lines[index]
    assert line is not None
    return dict(zip(list(line.first), list(line.mean), strict=True))


def same(a: dict[int, float | None], b: dict[int, float]) -> bool:
    return a.keys() == b.keys() and all(np.isclose(a[k], b[k]) for k in a)  # type: ignore[arg-type]


def run_labels(app: ControlRoom) -> list[str]:
    run_list = app.query_one(RunList)
    return [str(run_list.get_option_at_index(i).prompt) for i in range(run_list.option_count)]


async def test_marked_runs_overlay_with_a_legend_and_unmarking_restores_one_run(home: Path) -> None:
    with Store(home / "carl.db") as store:
        ids = {
            name: make_run(store, name, 30 + 10 * i, 0.8 + 0.05 * i, 1.0 + i)
            for i, name in enumerate(("alpha", "beta", "gamma"))
        }
        phi = {name: series(store, run_id, "phi/mean") for name, run_id in ids.items()}
        reward = {name: series(store, run_id, "reward") for name, run_id in ids.items()}
        task = {name: series(store, run_id, "rewards/task/mean") for name, run_id in ids.items()}
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "gamma")
        phi_chart, reward_chart = app.query_one("#phi-chart", Chart), app.query_one("#reward-chart", Chart)
        await pilot.press("x")  # gamma (the newest, highlighted first)
        assert list(app.main.comparison.marks) == [ids["gamma"]] and not app.main.comparison.comparing
        assert run_labels(app)[0] == MARK + "✓ gamma" and run_labels(app)[1] == " ✓ beta"
        assert phi_chart.lines[1:] == (), "one mark: the Φ pane still shows the highlighted run alone"
        await pilot.press("j", "x")  # and beta
        assert app.main.comparison.comparing
        await until(pilot, lambda: set(app.main.comparison.compared) == {ids["gamma"], ids["beta"]})
        # The highlighted run (beta) is drawn on top: it is the chart's first line.
        assert len(phi_chart.lines) == 2
        assert same(phi["beta"], drawn(phi_chart, 0)) and same(phi["gamma"], drawn(phi_chart, 1))
        assert same(reward["beta"], drawn(reward_chart, 0)) and same(reward["gamma"], drawn(reward_chart, 1))
        colors = {ids["beta"]: phi_chart.line_colors[0], ids["gamma"]: phi_chart.line_colors[1]}
        assert len(set(colors.values())) == 2 and reward_chart.line_colors == phi_chart.line_colors
        assert colors == {run_id: app.main.comparison.marks[run_id].color for run_id in colors}
        # The legend names each run in its line's colour, in the order marked, with its latest values.
        legend = app.query_one(Legend)
        assert legend.display and not app.query_one(RewardBars).display
        assert [row.label for row in legend.rows] == ["gamma", "beta"]
        assert legend.rows[0].style == phi_chart.line_style(colors[ids["gamma"]])
        assert legend.rows[1].style == phi_chart.line_style(colors[ids["beta"]])
        assert legend.rows[0].values == (f"{phi['gamma'][49]:.4f}", f"{reward['gamma'][49]:+.3f}")
        assert "gamma" in legend.render().plain and "beta" in legend.render().plain
        subtitle = app.query_one("#phi-chart").border_subtitle or ""
        assert "gamma" in subtitle and "beta" in subtitle
        assert "2 runs compared" in str(app.query_one("#phi-chart").border_title)
        assert "total reward per run" in str(app.query_one("#rewards-pane").border_title)
        # `T`: the task reward instead of the total.
        await pilot.press("T")
        assert same(task["beta"], drawn(reward_chart, 0)) and same(task["gamma"], drawn(reward_chart, 1))
        assert "task reward per run" in str(app.query_one("#rewards-pane").border_title)
        # A change to an unmarked run reaches the app but redraws neither compared chart.
        builds = (phi_chart.build_count, reward_chart.build_count)
        compared = dict(app.main.comparison.compared)
        with Store(home / "carl.db") as store:
            store.add_metrics(ids["alpha"], [(30, "reward", 2.0, time.time())])
        await until(pilot, lambda: any(r.name == "alpha" and r.last_step == 30 for r in app.main.runs))
        await pilot.pause()
        assert all(app.main.comparison.compared[i] is compared[i] for i in compared)
        assert (phi_chart.build_count, reward_chart.build_count) == builds
        # New steps of a marked run extend its line; the other run's series stays the same object.
        with Store(home / "carl.db") as store:
            store.add_phi_stats(ids["gamma"], [{"step": 50, "phi_mean": 0.42}])
        await until(pilot, lambda: app.main.comparison.compared[ids["gamma"]].latest("phi/mean") == 0.42)
        assert app.main.comparison.compared[ids["beta"]] is compared[ids["beta"]]
        assert drawn(phi_chart, 1)[50] == 0.42
        # Unmarking beta leaves one mark: the panes show the highlighted run alone again.
        await pilot.press("x")
        assert list(app.main.comparison.marks) == [ids["gamma"]] and not app.main.comparison.comparing
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "beta")
        assert len(phi_chart.lines) == 1 and same(phi["beta"], drawn(phi_chart, 0))
        assert phi_chart._band is not None  # the p10-p90 band is back
        assert app.query_one(RewardBars).display and not app.query_one(Legend).display
        assert app.query_one("#phi-chart").border_subtitle is None
        assert str(app.query_one("#phi-chart").border_title).startswith("Φ coherence 0.")
        assert [name for name, _ in app.query_one(RewardBars)._values] == ["format", "task", "total"]
        # `X` clears every mark.
        await pilot.press("x")
        assert (
            list(app.main.comparison.marks) == [ids["gamma"], ids["beta"]] and app.main.comparison.comparing
        )
        await pilot.press("X")
        assert app.main.comparison.marks == {} and not app.main.comparison.comparing
        assert all(label.startswith(" ") for label in run_labels(app))


def make_experiment(home: Path, started: int) -> tuple[int, list[int], int]:
    """An experiment of two arms by two seeds whose first `started` cells have runs, and one run
    outside it: (experiment id, the cells' run ids, the outside run's id)."""
    with Store(home / "carl.db") as store:
        outside = make_run(store, "outside", 20, 0.9, 1.0)
        exp = store.create_experiment("abl", {"model": "tiny"}, ["task-only", "cascade"], [1, 2], 20, 5)
        ids = []
        for i, (arm, seed) in enumerate([("task-only", 1), ("task-only", 2), ("cascade", 1), ("cascade", 2)]):
            if i >= started:
                break
            run_id = make_run(store, f"abl-{arm}-s{seed}", 20, 0.85 + 0.03 * i, 1.0 + i)
            store.update_experiment_run(exp, arm, seed, run_id=run_id, status="finished")
            ids.append(run_id)
    return exp, ids, outside


async def test_an_experiment_opens_as_a_comparison_coloured_by_arm(home: Path) -> None:
    exp, ids, outside = make_experiment(home, started=3)
    app = ControlRoom(home, start_engine=False, experiment="abl")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: set(app.main.comparison.compared) == set(ids))
        assert (
            list(app.main.comparison.marks) == ids and outside not in app.main.comparison.marks
        )  # exactly the experiment's runs
        assert [m.label for m in app.main.comparison.marks.values()] == [
            "task-only s1",
            "task-only s2",
            "cascade s1",
        ]
        colors = [m.color for m in app.main.comparison.marks.values()]
        assert colors[0] == colors[1] != colors[2], "the seeds of one arm share the arm's colour"
        phi_chart = app.query_one("#phi-chart", Chart)
        on_top = [ids[2], ids[0], ids[1]]  # the highlighted run (the newest, cascade s1) first
        assert app.watcher.selected == ids[2]
        with Store(home / "carl.db") as store:
            for index, run_id in enumerate(on_top):
                assert same(series(store, run_id, "phi/mean"), drawn(phi_chart, index))
        assert list(phi_chart.line_colors) == [app.main.comparison.marks[run_id].color for run_id in on_top]
        assert [row.label for row in app.query_one(Legend).rows] == [
            "task-only s1",
            "task-only s2",
            "cascade s1",
        ]
        assert "experiment abl" in str(app.query_one("#phi-chart").border_title)
        subtitle = app.query_one("#phi-chart").border_subtitle or ""
        assert "task-only" in subtitle and "cascade" in subtitle and "s1" not in subtitle  # one entry per arm
        # The last cell starts: its run joins the comparison, in its arm's colour.
        with Store(home / "carl.db") as store:
            late = make_run(store, "abl-cascade-s2", 20, 0.95, 4.0)
            store.update_experiment_run(exp, "cascade", 2, run_id=late, status="running")
        await until(pilot, lambda: late in app.main.comparison.compared)
        assert (
            app.main.comparison.marks[late].label == "cascade s2"
            and app.main.comparison.marks[late].color == colors[2]
        )
        assert len(phi_chart.lines) == 4


async def test_the_experiments_key_lists_them_and_marks_the_chosen_one(home: Path) -> None:
    _, ids, _ = make_experiment(home, started=4)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("E")
        await settled(pilot)
        assert app.screen.__class__.__name__ == "ChoiceScreen"
        await pilot.press("enter")
        await settled(pilot)
        assert (
            list(app.main.comparison.marks) == ids
            and app.main.comparison.experiment is not None
            and app.main.comparison.experiment.name == "abl"
        )
        await until(pilot, lambda: set(app.main.comparison.compared) == set(ids))
        await pilot.press("X")
        assert app.main.comparison.marks == {} and app.main.comparison.experiment is None


async def test_an_unknown_experiment_is_one_line_not_a_traceback(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARL_HOME", str(home))  # tui_main sets it from --home; restored afterwards
    make_experiment(home, started=1)
    assert tui_main(["--home", str(home), "--no-engine", "--experiment", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no experiment named 'nope'" in err and "abl" in err
    assert "Traceback" not in err
    app = ControlRoom(home, start_engine=False, experiment="nope")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: any("no experiment named 'nope'" in n.message for n in app._notifications))
        assert app.main.comparison.marks == {} and app.main.view is not None
