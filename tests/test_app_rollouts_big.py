"""The rollouts viewer on a store holding 1,000,000 rollouts in one run (past a run's cap: the worst case a
reader can meet): it opens, scrolls by line and by screen, jumps to the end, sorts and filters the whole run,
and reads pages for it, never the run. Not timed here: bench/bench_rollouts_view.py measures the scroll
latency."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import until
from test_app_rollouts import rows, status, viewer

from carl_tui.app import ControlRoom
from carl_tui.rollouts_view import RolloutsScreen
from engine.store import Store
from engine.store.rollouts import ROLLOUT_COLUMNS, ROLLOUT_WIDTH

pytestmark = pytest.mark.slow
ROWS = 1_000_000
PER_STEP = 1000
# The rollouts table's indexes (schema v6 and v7), built once the rows are in: faster than row by row.
INDEXES = {
    "idx_rollouts_run_step_idx": (
        "CREATE UNIQUE INDEX idx_rollouts_run_step_idx ON rollouts (run_id, step, idx)"
    ),
    **{
        f"idx_rollouts_run_{c}": f"CREATE INDEX idx_rollouts_run_{c} ON rollouts (run_id, {c})"
        for c in ("total", "advantage", "length")
    },
}


def total_of(i: int) -> float:
    return (i * 7919 % 1000) / 500  # 0 .. 1.998, spread over the steps


def build(home: Path) -> int:
    with Store(home / "carl.db") as store:
        run_id = store.create_run("big", source_kind="carl", status="finished")
        with store.transaction():
            for name in INDEXES:
                store.conn.execute(f"DROP INDEX {name}")
            rewards = json.dumps({"task": 1.0})
            store.conn.executemany(
                f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES ({', '.join('?' * ROLLOUT_WIDTH)})",
                (
                    (
                        run_id,
                        i // PER_STEP,
                        i % PER_STEP,
                        str(i % PER_STEP // 8),
                        f"prompt {i}",
                        f"completion {i}",
                        rewards,
                        total_of(i),
                        (i % 13 - 6) / 3,
                        i % 97,
                        None,
                        None,
                        None,
                        None,
                        0.0,
                    )
                    for i in range(ROWS)
                ),
            )
            for sql in INDEXES.values():
                store.conn.execute(sql)
    return run_id


@pytest.fixture(scope="module")
def big_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("big") / "home"
    home.mkdir(mode=0o700)
    build(home)
    yield home


async def test_a_million_rollouts_open_scroll_and_sort_by_pages(big_home: Path) -> None:
    app = ControlRoom(big_home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, RolloutsScreen))
        screen = viewer(app)
        # The newest step: 1,000 samples, read a page at a time as shown.
        await until(pilot, lambda: screen.list.total == PER_STEP and screen.list.row(0) is not None)
        assert screen.list.row(PER_STEP - 1) is None  # not shown, not read
        assert "step 999 (1,000 of 1,000)" in status(app) and screen.list.total == PER_STEP
        reader = screen.reader

        await pilot.press("a")  # every step: a million rows
        await until(pilot, lambda: screen.list.total == ROWS, timeout=30)
        started = time.monotonic()
        for _ in range(3):
            await pilot.press("pagedown")
        await pilot.press("down", "down")
        height = screen.list.size.height
        assert screen.list.cursor == 3 * (height - 1) + 2
        await until(pilot, lambda: screen.list.row(screen.list.cursor) is not None)
        row = screen.list.row(screen.list.cursor)
        assert (row.step, row.idx) == divmod(screen.list.cursor, PER_STEP)
        await pilot.press("end")
        await until(
            pilot, lambda: (r := screen.list.row(ROWS - 1)) is not None and r.step == ROWS // PER_STEP - 1
        )
        await pilot.press("up")
        await until(pilot, lambda: screen.list.row(ROWS - 2) is not None)
        assert screen.list.row(ROWS - 2).idx == PER_STEP - 2

        await pilot.press("s")  # the whole run by reward, the best first, along its index
        await until(pilot, lambda: screen.list.total == ROWS and screen.list.row(0) is not None, timeout=30)
        assert screen.list.row(0).total == max(total_of(i) for i in range(1000))
        await pilot.press("pagedown")
        await until(pilot, lambda: screen.list.row(screen.list.cursor) is not None)
        shown = [screen.list.row(i).total for i in range(screen.list.cursor + 1)]
        assert shown == sorted(shown, reverse=True)
        await pilot.press("end")
        await until(pilot, lambda: screen.list.row(ROWS - 1) is not None)
        assert screen.list.row(ROWS - 1).total == 0.0
        # A far jump (a scroll bar dragged to the middle): its page is found, then read by keyset.
        screen.list.scroll_to(y=ROWS // 2, animate=False, immediate=True)
        await until(pilot, lambda: screen.list.row(ROWS // 2) is not None)

        await pilot.press("slash", *"len>95", "enter")  # a filter over the whole run
        await until(pilot, lambda: "filter len>95" in status(app))
        await until(pilot, lambda: screen.list.total is not None, timeout=60)
        assert screen.list.total == sum(1 for i in range(ROWS) if i % 97 > 95)
        await until(pilot, lambda: screen.list.row(0) is not None)
        assert all(r.length == 96 for r in rows(app)[:50])
        elapsed = time.monotonic() - started
        # Pages, not the run: every page shown (and its neighbours) read once or twice.
        assert reader.rows_read < 20_000, reader.rows_read
        assert elapsed < 120
