"""The record inspector's keys through Pilot, at 80x24 and 160x50, on a run whose settings hold a value far
wider than the screen: `end` goes to the last row and `home` to the first, and neither scrolls sideways
(Textual's DataTable scrolls to the end of the widest value, where every other row is blank)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import until
from textual.widgets import DataTable

from carl_tui.app import ControlRoom
from carl_tui.inspector import InspectorScreen
from engine.store import Store

WIDE = {"name": "task", "weight": 1.0, "note": "a reward with a long description " * 20}  # ~700 cells of JSON


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Store(home / "carl.db") as store:
        config = {"method": "grpo", "rewards": [WIDE], "learning_rate": 1e-5}
        run = store.create_run("wide", source_kind="carl", status="finished", max_steps=10, config=config)
        store.add_metrics(run, [(9, f"metric/{i:02d}", i / 10, 1.0) for i in range(40)])
    return home


def shown(table: DataTable) -> str:
    return "\n".join(table.render_line(y).text for y in range(table.size.height))


@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
async def test_end_goes_to_the_last_row_and_home_to_the_first_never_sideways(
    home: Path, size: tuple[int, int]
) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, InspectorScreen) and app.screen.record is not None)
        table = app.screen.query_one(DataTable)
        assert table.max_scroll_x > 0, "the settings' value is wider than the table"
        last = table.row_count - 1
        await pilot.press("end")
        await until(pilot, lambda: table.cursor_row == last)
        # Drawn once the table has laid the row out (under load that can take more than one pause).
        await until(pilot, lambda: "rewards" in shown(table))  # the last row, the run's settings, in view
        assert table.scroll_x == 0
        assert table.scroll_y == table.max_scroll_y > 0
        await pilot.press("home")
        await until(pilot, lambda: table.cursor_row == 0)
        await until(pilot, lambda: "metrics at step 9" in shown(table))
        assert table.scroll_x == 0 and table.scroll_y == 0
