"""The Φ and Rewards panes as a person reads them (issue 14): the Rewards pane's empty state said
once and centred, and axes that do not zoom into noise (a minimum span per axis, labels with at
most 4 significant digits). Real store files, the real app through Pilot, the rendered screen."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
from support import until

from carl_tui.app import ControlRoom
from engine.store import Store
from widgets.chart import Chart

V = 512  # ln 512 = 6.238: an untrained model's entropy is near that, its Φ near 0.0023
EMPTY_REWARDS = "no reward data yet"
SIZES = [(80, 24), (160, 50)]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def flat_run(store: Store, name: str, *, rewards: bool, steps: int = 60) -> int:
    """An untrained tiny model's run: Φ flat near 0.0023 with noise of a few 1e-6, its entropy
    near ln|V|; with `rewards`, a total and a task reward flat near 0.25 with noise of 1e-3."""
    run_id = store.create_run(name, source_kind="carl", status="running", max_steps=200, vocab_size=V)
    rng = np.random.default_rng(14)
    now = time.time()
    stats, rows = [], []
    for s in range(steps):
        phi = 0.00233 + float(rng.normal(0, 6e-6))
        stats.append(
            {
                "step": s,
                "phi_mean": phi,
                "phi_p10": phi - 1e-5,
                "phi_p90": phi + 1e-5,
                "entropy_mean": (1 - phi) * math.log(V),
                "wall_time": now,
            }
        )
        if rewards:
            rows += [
                (s, "reward", 0.25 + float(rng.normal(0, 1e-3)), now),
                (s, "rewards/task/mean", 0.25 + float(rng.normal(0, 1e-3)), now),
            ]
    store.add_phi_stats(run_id, stats)
    if rows:
        store.add_metrics(run_id, rows)
    return run_id


def screen_lines(app: ControlRoom) -> list[str]:
    """The whole screen as the terminal shows it (the compositor's output, every widget in place)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def axis_labels(chart: Chart) -> tuple[list[str], list[str]]:
    """The tick labels printed at the left (before ┤) and right (after ├) axes, top to bottom."""
    lines = [chart.render_line(y).text for y in range(chart.size.height)]
    left = [line.split("┤")[0].strip() for line in lines if "┤" in line]
    right = [line.split("├")[1].strip() for line in lines if "├" in line]
    return left, right


def significant_digits(label: str) -> int:
    """6.224 -> 4, 6.22366 -> 6, 2.35e-3 -> 3, 0.00 -> 1 (counted here, not by the code under test)."""
    mantissa = label.lower().split("e")[0].lstrip("-").replace(".", "")
    return len(mantissa.lstrip("0")) or 1


def spread(labels: list[str]) -> float:
    values = [float(label) for label in labels]
    return max(values) - min(values)


@pytest.mark.parametrize("size", SIZES)
async def test_the_rewards_empty_state_is_said_once_and_centred(home: Path, size: tuple[int, int]) -> None:
    with Store(home / "carl.db") as store:
        flat_run(store, "no-rewards-yet", rewards=False)  # Φ arrives first; no reward yet
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "no-rewards-yet")
        await pilot.pause()
        lines = screen_lines(app)
        hits = [(y, line.index(EMPTY_REWARDS)) for y, line in enumerate(lines) if EMPTY_REWARDS in line]
        assert sum(line.count(EMPTY_REWARDS) for line in lines) == 1, "\n".join(lines)
        (row, col), pane = hits[0], app.query_one("#rewards-pane").content_region
        assert pane.y <= row < pane.bottom
        centred = pane.x + (pane.width - len(EMPTY_REWARDS)) // 2
        assert abs(col - centred) <= 1, f"message at column {col}, the pane's centre needs {centred}"


@pytest.mark.parametrize("size", SIZES)
async def test_a_flat_phi_is_drawn_on_a_minimum_span_with_short_labels(
    home: Path, size: tuple[int, int]
) -> None:
    with Store(home / "carl.db") as store:
        flat_run(store, "untrained", rewards=True)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "untrained")
        await pilot.pause()
        phi_chart = app.query_one("#phi-chart", Chart)
        left, right = axis_labels(phi_chart)
        assert len(left) >= 2 and len(right) == len(left), (left, right)
        assert all(significant_digits(label) <= 4 for label in left + right), (left, right)
        # Φ lives in [0, 1]: a window of at least 0.05 around 0.0023 is shifted up to start at 0
        assert float(left[-1]) == 0.0 and spread(left) >= 0.04, left
        assert all(0.0 <= float(label) <= 1.0 for label in left), left
        lo, hi = phi_chart.drawn_range
        assert lo == 0.0 and hi - lo >= 0.05 - 1e-12
        # entropy, H = (1 - Φ) ln|V|: at Φ = 0 it is ln 512 = 6.238
        assert right[-1] in ("6.24", "6.238") and spread(right) >= 0.1, right

        reward_chart = app.query_one("#reward-chart", Chart)
        left, _ = axis_labels(reward_chart)
        assert len(left) >= 2 and all(significant_digits(label) <= 4 for label in left), left
        lo, hi = reward_chart.drawn_range
        assert hi - lo >= 0.1 - 1e-12 and lo < 0.25 < hi and math.isclose((lo + hi) / 2, 0.25, abs_tol=0.01)
        assert spread(left) >= 0.05 - 1e-9, left
