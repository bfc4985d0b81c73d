"""Histograms in the metrics explorer (`m`) as heat strips over steps, in the real app through Pilot at 80×24
and 160×50, on a TensorBoard run written by torch's SummaryWriter (`add_histogram`) and imported by `carl
observe`."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from support import until
from textual.widgets import OptionList

from carl_tui.app import ControlRoom
from carl_tui.explorer import ExplorerScreen
from carl_tui.explorer_grid import ChartGrid
from engine.observe import observe
from engine.store import Store
from engine.store.histograms import Histogram, add_histograms
from widgets.chart import Chart
from widgets.heat_strip import HeatStrip

STEPS = 60


@pytest.fixture(scope="module")
def tensorboard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    root = tmp_path_factory.mktemp("tb")
    writer = SummaryWriter(str(root / "ppo"))
    rng = np.random.default_rng(0)
    for step in range(STEPS):
        writer.add_scalar("train/loss", 1 / (step + 1), step)
        writer.add_histogram("actor/logprobs", rng.normal(-step / 20, 1.0, 500), step)
        writer.add_histogram("actor/entropy", rng.gamma(2.0, 0.5, 500), step)
    writer.close()
    return root


@pytest.fixture
def home(tmp_path: Path, tensorboard_dir: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Store(home / "carl.db") as store:
        observe(store, tensorboard_dir)
    return home


def explorer(app: ControlRoom) -> ExplorerScreen:
    assert isinstance(app.screen, ExplorerScreen)
    return app.screen


def loaded(screen: ExplorerScreen) -> bool:
    """The listing is read, and every chart and heat strip in view has its data."""
    if screen.listing is None:
        return False
    run = screen.runs[0].id
    return all(
        (run, key) in (screen.heats if screen.is_heat(key) else screen.series)
        for key in screen.visible_keys()
    )


async def open_explorer(pilot, app: ControlRoom) -> ExplorerScreen:  # noqa: ANN001
    await until(pilot, lambda: app.main.view is not None)
    await pilot.press("m")
    await until(pilot, lambda: isinstance(app.screen, ExplorerScreen) and loaded(app.screen))
    await pilot.pause()
    return explorer(app)


async def test_the_grid_at_160x50_draws_a_heat_strip_per_key_of_histograms(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_explorer(pilot, app)
        grid = screen.query_one(ChartGrid)
        assert [info.key for info in screen.listing.keys] == ["loss", "actor/entropy", "actor/logprobs"]  # type: ignore[union-attr]
        heats = dict(grid.heat_cells())
        assert set(heats) == {"actor/entropy", "actor/logprobs"}
        charts = dict(grid.cells())
        assert charts["loss"].display and not charts["actor/logprobs"].display, "a cell shows one of the two"
        strip = heats["actor/logprobs"]
        assert strip.display and strip.fit and strip.steps == list(range(STEPS))
        assert str(strip.border_title) == "actor/logprobs  ▦ · 60 steps"
        await pilot.pause()
        lines = strip.size.height - 1
        assert lines < STEPS and strip.shown_rows()[0] == 0 and strip.shown_rows()[-1] == STEPS - 1
        assert len(strip.shown_rows()) == lines, "the steps spread over the lines there are"
        # the step gutter, the shades of density, the value axis
        rendered = [strip.render_line(y).text for y in range(strip.size.height)]
        assert rendered[0].lstrip().startswith("0│") and rendered[lines - 1].lstrip().startswith("59│")
        assert all(any(ch in row for ch in "░▒▓█") for row in rendered[:lines])
        assert rendered[-1].lstrip().startswith("└")


async def test_the_list_at_80x24_then_the_zoom_with_its_step_cursor(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_explorer(pilot, app)
        keys = screen.query_one("#explorer-keys", OptionList)
        prompts = [str(keys.get_option_at_index(i).prompt).rstrip() for i in range(keys.option_count)]
        assert "  actor/logprobs  ▦" in prompts
        await pilot.press("down", "down")
        await until(pilot, lambda: screen.current == "actor/logprobs" and loaded(screen))
        heat = screen.query_one("#explorer-heat", HeatStrip)
        assert (
            screen.has_class("-heat")
            and heat.display
            and not screen.query_one("#explorer-chart", Chart).display
        )
        await pilot.press("enter")
        zoom = screen.query_one("#explorer-heat-zoom", HeatStrip)
        await until(pilot, lambda: zoom.display and zoom.size.height > 0 and zoom.steps == list(range(STEPS)))
        await pilot.pause()
        lines = zoom.plot_height
        assert not zoom.fit and zoom.shown_rows() == list(range(STEPS - lines, STEPS)), "the newest steps"
        before = zoom.render_count
        await pilot.press("left")  # the cursor: on the newest step first
        await until(pilot, lambda: zoom.cursor == STEPS - 1)
        assert "step 59 · 500 values" in str(zoom.border_subtitle)
        await pilot.press("pageup")
        await until(pilot, lambda: zoom.cursor == STEPS - 1 - lines)
        await pilot.pause()
        assert zoom.cursor in zoom.shown_rows() and zoom.shown_rows()[0] == zoom.cursor
        assert zoom.render_count - before <= 3 * lines, "only the lines on screen are rendered"
        await pilot.press("escape")
        assert not screen.has_class("-zoom") and heat.display


async def test_a_key_of_histograms_is_not_pinned(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_explorer(pilot, app)
        await pilot.press("down")
        assert screen.is_heat(screen.current)
        pinned = set(screen.pinned)
        await pilot.press("p", "l")
        assert screen.pinned == pinned and not screen.log_keys


async def test_the_heat_strip_follows_a_run_that_grows(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_explorer(pilot, app)
        strip = dict(screen.query_one(ChartGrid).heat_cells())["actor/entropy"]
        run_id = screen.runs[0].id
        with Store(home / "carl.db") as store:
            rows = [
                (step, "actor/entropy", Histogram((0.0, 1.0, 2.0), (1.0, 3.0)), time.time())
                for step in (60, 61)
            ]
            add_histograms(store, run_id, rows)
        await until(pilot, lambda: strip.steps[-2:] == [60, 61])
        assert str(strip.border_title).endswith("· 62 steps")
