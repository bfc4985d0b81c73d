"""The metrics explorer (`m`) and the record inspector (`i`) in the real app through Pilot, at 80×24 (a list
and one chart) and 160×50 (a grid), on a store holding an observed TensorBoard run (veRL's keys, written by
torch's SummaryWriter and imported by `carl observe`) and a GRPO run of ours (its rows written by our
runner's Reporter)."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import series, until
from textual.widgets import DataTable, OptionList

from carl_tui.app import ControlRoom
from carl_tui.explorer import ExplorerScreen
from carl_tui.explorer_grid import ChartGrid
from carl_tui.explorer_model import Pow10
from carl_tui.inspector import InspectorScreen
from carl_tui.preferences import load_config
from engine.observe import observe
from engine.store import Store
from engine.training.backend import Reporter, StepRecord
from widgets.chart import Chart

STEPS = 30
VERL = {  # veRL's names (engine/observe/frameworks.py maps the first eight)
    "actor/entropy": lambda s: 2.0 - s / 40,
    "critic/score/mean": lambda s: s / 40,
    "actor/kl_loss": lambda s: 0.001 * s,
    "actor/pg_clipfrac": lambda s: 0.01,
    "response_length/mean": lambda s: 100.0 + s,
    "actor/grad_norm": lambda s: 0.5,
    "actor/lr": lambda s: 1e-6,
    "actor/pg_loss": lambda s: math.sin(s / 5),  # below 0 at times: the log axis leaves those out
    "critic/score/max": lambda s: 1.0,
    "timing_s/old_log_prob": lambda s: 3.0,  # timing_s/gen would be perf/time/generation_s
}


def our_metrics(step: int, seed: float = 0.0) -> dict[str, float]:
    """What our GRPO backends report per step (engine/training/mlx_backend.py `_grpo_metrics`)."""
    t = step / (STEPS - 1)
    return {
        "loss": 1.0 - t + seed,
        "reward": t + 0.3 * math.sin(3 * step) + seed,
        "reward_std": 0.2,
        "frac_reward_zero_std": 0.1,
        "entropy": 1.5 - t,
        "grad_norm": 1.0 + 0.5 * math.cos(step),
        "learning_rate": 1e-5,
        "clip_ratio/region_mean": 0.02,
        "completions/mean_length": 30.0 + 10 * t,
        "completions/max_length": 48.0,
        "completions/clipped_ratio": 0.0,
        "kl": 0.01 * t,
        "rewards/task/mean": t,
        "rewards/format/mean": 0.5,
    }


def write_our_run(store: Store, name: str, seed: float = 0.0, steps: int = STEPS) -> int:
    run_id = store.create_run(
        name, source_kind="carl", status="finished", max_steps=steps, vocab_size=512, backend="torch"
    )
    reporter = Reporter(store, run_id)
    for step in range(steps):
        phi = 0.5 + 0.4 * step / steps
        rollouts = [
            {
                "idx": i,
                "group_id": "g0",
                "prompt": "2+2?",
                "completion": "4",
                "rewards": {"task": 1.0},
                "length": 1,
            }
            for i in range(4)
        ]
        reporter.write(
            StepRecord(
                step,
                metrics=our_metrics(step, seed),
                phi={"phi_mean": phi, "phi_p10": phi - 0.05, "phi_p90": phi + 0.05, "entropy_mean": 1.0},
                rollouts=rollouts if step % 10 == 0 else [],
            )
        )
    return run_id


@pytest.fixture(scope="module")
def tensorboard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A veRL run's TensorBoard events, written once for the module by torch's SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path_factory.mktemp("tb") / "verl_grpo"
    writer = SummaryWriter(str(logdir))
    for step in range(1, 41):
        for key, value in VERL.items():
            writer.add_scalar(key, value(step), step)
    writer.close()
    return logdir


@pytest.fixture
def home(tmp_path: Path, tensorboard_dir: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Store(home / "carl.db") as store:
        observe(store, shutil.copytree(tensorboard_dir, tmp_path / "tb" / "verl_grpo").parent)
        write_our_run(store, "grpo-ours")
    yield home


def explorer(app: ControlRoom) -> ExplorerScreen:
    screen = app.screen
    assert isinstance(screen, ExplorerScreen)
    return screen


def header(screen: ExplorerScreen) -> str:
    return str(screen.query_one("#explorer-header").render())


def listed(screen: ExplorerScreen) -> list[str]:
    keys = screen.query_one("#explorer-keys", OptionList)
    return [str(keys.get_option_at_index(i).prompt).rstrip() for i in range(keys.option_count)]


def drawn(chart: Chart, index: int = 0) -> dict[int, float]:
    line = chart.lines[index]
    assert line is not None
    return dict(zip(list(line.first), list(line.mean), strict=True))


def loaded(screen: ExplorerScreen) -> bool:
    """The listing is read and every chart in view has its series."""
    return screen.listing is not None and all(
        (run.id, key) in screen.series for key in screen.visible_keys() for run in screen.runs
    )


async def open_explorer(pilot, app: ControlRoom, run: str) -> ExplorerScreen:  # noqa: ANN001
    await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == run)
    await pilot.press("m")
    await until(pilot, lambda: isinstance(app.screen, ExplorerScreen) and loaded(app.screen))
    await pilot.pause()
    return explorer(app)


async def select_run(pilot, app: ControlRoom, name: str) -> None:  # noqa: ANN001
    while app.main.view is None or app.main.view.run.name != name:
        await pilot.press("j")
        await until(pilot, lambda: app.main.view is not None)


# -- keys, groups, the list and the grid ---------------------------------------------------------------


async def test_the_list_at_80x24_groups_every_key_with_its_newest_value(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await select_run(pilot, app, "verl_grpo")
        screen = await open_explorer(pilot, app, "verl_grpo")
        assert screen.has_class("-list") and "run verl_grpo · 10 of 10 keys · no smoothing" in header(screen)
        lines = listed(screen)
        # headings (the keys without a prefix first), then each key with its newest value at the right
        assert [line for line in lines if not line.startswith("  ")] == [
            "(no prefix)",
            "clip_ratio",
            "completions",
            "critic",
            "timing_s",
        ]
        entropy = next(line for line in lines if "entropy" in line)
        assert entropy.startswith("  entropy  (actor/entropy)") and entropy.endswith(" 1")  # 2 - 40/40
        assert any(line.startswith("  critic/score/max") for line in lines), "an unmapped key keeps its name"
        # one chart: the highlighted key's, with the values stored
        chart = screen.query_one("#explorer-chart", Chart)
        assert screen.current == "entropy" and chart.display
        run_id = app.main.view.run.id  # type: ignore[union-attr]
        with Store(home / "carl.db") as store:
            stored = series(store, run_id, "kl")
        await pilot.press("down", "down")  # grad_norm, kl: the chart follows the highlight
        await until(pilot, lambda: screen.current == "kl" and chart.lines[:1] != (None,) and len(chart.lines))
        await until(pilot, lambda: drawn(chart) == stored)
        assert str(chart.border_title) == "kl  (actor/kl_loss) 0.04"
        assert not screen.query(ChartGrid).first().display


async def test_the_grid_at_160x50_draws_only_the_charts_in_view(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await open_explorer(pilot, app, "grpo-ours")
        grid = screen.query_one(ChartGrid)
        assert screen.has_class("-grid") and grid.display
        total = len(screen.listing.keys)  # type: ignore[union-attr]
        assert total == 19 and "19 of 19 keys" in header(screen)
        cells = grid.cells()
        assert grid.columns == 4 and 8 <= len(cells) < total, "the rows in view only"
        titles = [str(chart.border_title) for _, chart in cells]
        assert titles[0].startswith("entropy ") and any(t.startswith("kl ") for t in titles)
        headings = [
            str(slot.heading.render()) for slot in grid.slots if slot.display and slot.heading.display
        ]
        assert headings[0] == "(no prefix)"
        # only the keys in view were read
        run_id = screen.runs[0].id
        assert {key for (_, key) in screen.series} == {key for key, _ in cells}
        with Store(home / "carl.db") as store:
            assert drawn(cells[0][1]) == series(store, run_id, cells[0][0])
        # ↓ moves a row; past the rows in view the grid scrolls by rows and reads the keys that came in
        first = screen.top
        for _ in range(len(screen.rows)):
            await pilot.press("down")
        assert screen.top > first and screen.current == screen.rows[-1].keys[0]
        await until(pilot, lambda: loaded(screen))
        assert screen.current in {key for key, _ in grid.cells()}
        selected = [chart for key, chart in grid.cells() if chart.has_class("-selected")]
        assert len(selected) == 1 and str(selected[0].border_title).startswith(screen.current)  # type: ignore[arg-type]
        assert len(grid.slots) <= 5, "slots are reused, not made per row"


# -- the filter, zoom, smoothing, log ---------------------------------------------------------------------


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_the_filter_takes_a_substring_or_a_glob_and_esc_clears_it(
    home: Path, size: tuple[int, int]
) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        screen = await open_explorer(pilot, app, "grpo-ours")
        await pilot.press("slash", *"length")
        assert [info.key for info in screen.keys] == ["completions/max_length", "completions/mean_length"]
        assert "2 of 19 keys · filter length" in header(screen)
        await pilot.press(*("backspace" for _ in "length"), *"rewards/*")
        assert [info.key for info in screen.keys] == ["rewards/format/mean", "rewards/task/mean"]
        await pilot.press("enter")  # the filter is done: the keys have the focus again
        await until(pilot, lambda: loaded(screen))
        if size == (80, 24):
            assert [line.split()[0] for line in listed(screen)] == [
                "rewards",
                "rewards/format/mean",
                "rewards/task/mean",
            ]
            assert screen.focused is screen.query_one("#explorer-keys")
        else:
            assert [key for key, _ in screen.query_one(ChartGrid).cells()] == [
                "rewards/format/mean",
                "rewards/task/mean",
            ]
        await pilot.press("escape")
        assert screen.filter_text == "" and len(screen.keys) == 19 and "19 of 19 keys" in header(screen)
        await pilot.press("escape")  # nothing left to clear: the explorer closes
        assert not isinstance(app.screen, ExplorerScreen)


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_enter_zooms_one_chart_and_enter_or_esc_goes_back(home: Path, size: tuple[int, int]) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        screen = await open_explorer(pilot, app, "grpo-ours")
        await pilot.press("down")
        key = screen.current
        await pilot.press("enter")
        zoom = screen.query_one("#explorer-zoom", Chart)
        await until(pilot, lambda: zoom.display and zoom.lines[:1] != (None,) and len(zoom.lines) > 0)
        assert screen.has_class("-zoom") and zoom.size.width == size[0] - 2
        assert str(zoom.border_title).startswith(key or "")
        run_id = screen.runs[0].id
        with Store(home / "carl.db") as store:
            assert drawn(zoom) == series(store, run_id, key)
        await pilot.press("enter")
        assert not screen.has_class("-zoom") and not zoom.display
        await pilot.press("enter", "escape")
        assert not screen.has_class("-zoom") and isinstance(app.screen, ExplorerScreen)


def tensorboard_ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's debiased EMA in its closed form: sum_i (1 - w) w^(t - i) x_i / (1 - w^t)."""
    out = []
    for t in range(1, len(values) + 1):
        total = sum((1 - weight) * weight ** (t - i) * values[i - 1] for i in range(1, t + 1))
        out.append(total / (1 - weight**t))
    return out


def trackio_mean(values: list[float], window: int) -> list[float]:
    half = max(3, min(window, len(values))) // 2
    return [
        sum(values[max(0, i - half) : i + half + 1]) / len(values[max(0, i - half) : i + half + 1])
        for i in range(len(values))
    ]


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_s_cycles_the_smoothing_and_brackets_change_its_weight(
    home: Path, size: tuple[int, int]
) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        screen = await open_explorer(pilot, app, "grpo-ours")
        await pilot.press("slash", *"rewar[d]", "enter")  # a glob: the key `reward` alone
        await until(pilot, lambda: screen.current == "reward" and loaded(screen))
        chart = (
            screen.query_one("#explorer-chart", Chart)
            if size == (80, 24)
            else next(c for k, c in screen.query_one(ChartGrid).cells() if k == "reward")
        )
        run_id = screen.runs[0].id
        with Store(home / "carl.db") as store:
            stored = series(store, run_id, "reward")
        values = [stored[step] for step in sorted(stored)]
        assert list(drawn(chart).values()) == values and chart._band is None
        await pilot.press("s")
        assert "EMA w=0.6" in header(screen)
        assert list(drawn(chart).values()) == pytest.approx(tensorboard_ema(values, 0.6))
        assert chart._band is not None, "the raw values stay, faint, under the smoothed line"
        await pilot.press("right_square_bracket")
        assert "EMA w=0.7" in header(screen)
        assert list(drawn(chart).values()) == pytest.approx(tensorboard_ema(values, 0.7))
        await pilot.press("right_square_bracket", "right_square_bracket", "left_square_bracket")
        assert "EMA w=0.8" in header(screen)
        await pilot.press("s")
        assert "centred mean k=10" in header(screen)
        assert list(drawn(chart).values()) == pytest.approx(trackio_mean(values, 10))
        await pilot.press("left_square_bracket")
        assert "centred mean k=5" in header(screen)
        assert list(drawn(chart).values()) == pytest.approx(trackio_mean(values, 5))
        await pilot.press("s")
        assert "no smoothing" in header(screen) and list(drawn(chart).values()) == values


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_l_puts_the_chart_on_a_log_axis_and_says_what_it_leaves_out(
    home: Path, size: tuple[int, int]
) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await select_run(pilot, app, "verl_grpo")
        screen = await open_explorer(pilot, app, "verl_grpo")
        await pilot.press("slash", *"pg_loss", "enter")  # the source's name of `loss`
        await until(pilot, lambda: screen.current == "loss" and loaded(screen))
        await pilot.press("enter")  # zoomed
        zoom = screen.query_one("#explorer-zoom", Chart)
        await until(pilot, lambda: len(zoom.lines) > 0 and zoom.lines[0] is not None)
        run_id = screen.runs[0].id
        with Store(home / "carl.db") as store:
            stored = series(store, run_id, "loss")
        below = sum(1 for v in stored.values() if v is not None and v <= 0)
        assert below > 0
        await pilot.press("l")
        title = str(zoom.border_title)
        assert f"· log · {below} ≤ 0 left out" in title
        logged = drawn(zoom)
        assert {s for s, v in logged.items() if not math.isnan(v)} == {s for s, v in stored.items() if v > 0}
        assert all(logged[s] == pytest.approx(math.log10(v)) for s, v in stored.items() if v > 0)
        assert zoom._right_transform == Pow10(), "the right axis reads the log back as the value"
        await pilot.press("l")
        assert "log" not in str(zoom.border_title) and drawn(zoom) == stored


# -- pins ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_a_pin_is_kept_in_tui_toml_and_shown_on_the_main_screen_after_a_restart(
    home: Path, size: tuple[int, int]
) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        screen = await open_explorer(pilot, app, "grpo-ours")
        await pilot.press("slash", *"kl", "enter", "p")
        assert load_config(home).pins == {"grpo-ours": ["kl"]}
        assert str(screen.query_one("#explorer-header").render())
        await pilot.press("escape", "escape")
        assert not isinstance(app.screen, ExplorerScreen)
        await until(
            pilot, lambda: bool(app.query("#pins .pin-chart")) and app.query_one(".pin-chart", Chart).lines
        )
    run_id = next(r.id for r in app.main.runs if r.name == "grpo-ours")
    with Store(home / "carl.db") as store:
        stored = series(store, run_id, "kl")
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(
            pilot, lambda: bool(app.query(".pin-chart")) and bool(app.query_one(".pin-chart", Chart).lines)
        )
        chart = app.query_one(".pin-chart", Chart)
        assert drawn(chart) == stored and str(chart.border_title).startswith("kl ")
        await pilot.pause()
        assert chart.region.height >= 4 and chart.region.width >= 24, "it reads at this size"
        # the Trajectories/Agents row is empty: the pinned charts take its place
        assert app.query_one("#main").has_class("-pins-only") and not app.query_one("#activity").region.height
        # unpinned from the explorer: the row goes
        await pilot.press("m")
        await until(pilot, lambda: isinstance(app.screen, ExplorerScreen) and loaded(app.screen))
        await pilot.press("slash", *"kl", "enter", "p", "escape", "escape")
        assert load_config(home).pins == {}
        assert not app.query_one("#pins").display and not app.query_one("#main").has_class("-pins-only")


async def test_a_read_only_session_pins_for_the_session_only(home: Path) -> None:
    app = ControlRoom(home, start_engine=False, readonly=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_explorer(pilot, app, "grpo-ours")
        await pilot.press("p", "escape")
        await until(pilot, lambda: bool(app.query(".pin-chart")))
        assert app.config.pins == {"grpo-ours": ["entropy"]}
    assert not (home / "tui.toml").exists()


# -- the inspector -------------------------------------------------------------------------------------------


def table_rows(screen: InspectorScreen) -> list[tuple[str, str]]:
    table = screen.query_one(DataTable)
    return [tuple(str(cell) for cell in table.get_row_at(i)) for i in range(table.row_count)]  # type: ignore[misc]


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_the_inspector_shows_every_stored_value_of_the_step_under_the_cursor(
    home: Path, size: tuple[int, int]
) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        screen = await open_explorer(pilot, app, "grpo-ours")
        if size == (160, 50):
            await pilot.press("enter")  # the cursor lives on one chart: the zoomed one in the grid
        await pilot.press("left")  # the cursor starts at the newest step: 29
        await until(pilot, lambda: screen.cursor_step == STEPS - 1)
        for _ in range(STEPS - 1 - 20):
            await pilot.press("left")
        assert screen.cursor_step == 20
        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, InspectorScreen) and app.screen.record is not None)
        inspector = app.screen
        assert isinstance(inspector, InspectorScreen)
        rows = table_rows(inspector)
        values = dict(rows)
        expected = our_metrics(20)
        for key, value in expected.items():
            assert values[key] == repr(value), key
        assert values["phi/mean"] == repr(0.5 + 0.4 * 20 / STEPS)
        assert values["rollouts at this step"] == "4"
        assert (
            values["name"] == "grpo-ours" and values["vocab_size"] == "512" and values["backend"] == "torch"
        )
        title = str(inspector.query_one("#inspector-title").render())
        assert "step 20 · 19 keys · 4 rollouts" in title
        # `/` filters the rows
        await pilot.press("slash", *"rewards/*")
        names = [name for name, _ in table_rows(inspector)]
        assert names == ["metrics at step 20", "rewards/format/mean", "rewards/task/mean"]
        await pilot.press("escape")
        assert len(table_rows(inspector)) == len(rows)
        await pilot.press("escape")
        assert app.screen is screen


async def test_i_on_the_main_screen_inspects_the_newest_step_with_the_sources_names(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await select_run(pilot, app, "verl_grpo")
        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, InspectorScreen) and app.screen.record is not None)
        rows = dict(table_rows(app.screen))  # type: ignore[arg-type]
        assert rows["entropy  (actor/entropy)"] == repr(1.0) and rows["framework"] == "verl"
        assert rows["critic/score/max"] == repr(1.0), "an unmapped key keeps its name"
        assert rows["rollouts at this step"] == "0"
        assert "step 40 · 10 keys" in str(app.screen.query_one("#inspector-title").render())


# -- comparing runs, a store that moves, hostile names -------------------------------------------------------


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_marked_runs_are_overlaid_in_their_colours(home: Path, size: tuple[int, int]) -> None:
    with Store(home / "carl.db") as store:
        other = write_our_run(store, "grpo-other", seed=0.25)
        ours = store.conn.execute("SELECT id FROM runs WHERE name=?", ("grpo-ours",)).fetchone()[0]
        stored = {run_id: series(store, run_id, "reward") for run_id in (ours, other)}
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "grpo-other")
        await pilot.press("x", "j", "x")  # grpo-other, then grpo-ours (highlighted, so drawn on top)
        assert app.main.comparison.comparing
        screen = await open_explorer(pilot, app, "grpo-ours")
        assert "Metrics · 2 runs: ━ grpo-ours ━ grpo-other · 19 of 19 keys" in header(screen)
        assert [run.id for run in screen.runs] == [ours, other]
        await pilot.press("slash", *"rewar[d]", "enter")
        await until(pilot, lambda: screen.current == "reward" and loaded(screen))
        chart = (
            screen.query_one("#explorer-chart", Chart)
            if size == (80, 24)
            else next(c for k, c in screen.query_one(ChartGrid).cells() if k == "reward")
        )
        assert drawn(chart, 0) == stored[ours] and drawn(chart, 1) == stored[other]
        assert chart.line_colors == (
            app.main.comparison.marks[ours].color,
            app.main.comparison.marks[other].color,
        )
        assert len(set(chart.line_colors)) == 2


async def test_the_explorer_follows_a_run_that_grows(home: Path) -> None:
    with Store(home / "carl.db") as store:
        run_id = store.create_run("live", source_kind="carl", status="running", max_steps=100)
        store.add_metrics(run_id, [(s, "kl", s / 100, time.time()) for s in range(10)])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_explorer(pilot, app, "live")
        chart = screen.query_one("#explorer-chart", Chart)
        assert len(drawn(chart)) == 10
        with Store(home / "carl.db") as store:
            store.add_metrics(run_id, [(s, "kl", s / 100, time.time()) for s in range(10, 15)])
            store.add_metrics(run_id, [(s, "loss", 1.0, time.time()) for s in range(15)])
        await until(pilot, lambda: len(drawn(chart)) == 15)
        await until(pilot, lambda: "2 of 2 keys" in header(screen))
        assert "kl 0.14" in str(chart.border_title)


async def test_hostile_names_are_shown_as_text(home: Path) -> None:
    with Store(home / "carl.db") as store:
        run_id = store.create_run("[b]evil[/b]\x1b[2J", source_kind="jsonl", status="finished")
        store.add_metrics(run_id, [(1, "[bold]k\x1b[31m\ny", 1.0, time.time())])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        # the store keeps a name printable (engine/names.py): the escape became a space, the markup stays
        # text; a key is kept as it came, and shown with its control characters written out
        screen = await open_explorer(pilot, app, "[b]evil[/b] [2J")
        assert "run [b]evil[/b] [2J" in header(screen)
        assert any("[bold]k\\x1b[31m\\ny" in line for line in listed(screen))
        assert "[bold]k\\x1b[31m\\ny 1" in str(screen.query_one("#explorer-chart").border_title)
        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, InspectorScreen) and app.screen.record is not None)
        names = [name for name, _ in table_rows(app.screen)]  # type: ignore[arg-type]
        assert "[bold]k\\x1b[31m\\ny" in names


async def test_the_pinned_charts_show_as_many_as_fit_and_say_how_many_more(home: Path) -> None:
    (home / "tui.toml").write_text('[pins]\ngrpo-ours = ["kl", "loss", "reward", "entropy"]\n')
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot, lambda: len(app.query(".pin-chart")) == 4 and all(c.lines for c in app.query(".pin-chart"))
        )
        await pilot.pause()
        charts = list(app.query(".pin-chart").results(Chart))
        shown = [chart for chart in charts if chart.display]
        assert [str(chart.border_title).split()[0] for chart in charts] == ["kl", "loss", "reward", "entropy"]
        assert len(shown) == 2 and str(shown[-1].border_subtitle) == "+2 more · m"
        await pilot.resize_terminal(160, 50)
        await until(pilot, lambda: all(chart.display for chart in charts))
        assert not any(chart.border_subtitle for chart in charts)
