"""The control room through Pilot: what each pane shows for a known run, keys, empty states,
live updates and bad input. Real store files, the real app; the engine is not started here
(tests/test_daemon.py covers it) except where a test says so."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from pathlib import Path

import pytest
from support import status_text, until

from carl_tui.app import ControlRoom
from carl_tui.preferences import load_config
from carl_tui.runs import RunList
from engine.store import SCHEMA_VERSION, Store
from widgets.activity import TRAJECTORIES_EMPTY
from widgets.agents import AGENTS_EMPTY
from widgets.chart import Chart
from widgets.reward_bars import RewardBars

V = 512


def make_run(
    store: Store, name: str, steps: int, *, max_steps: int | None = None, status: str = "running"
) -> int:
    run_id = store.create_run(name, source_kind="jsonl", status=status, max_steps=max_steps, vocab_size=V)
    now = time.time()
    rows = []
    for s in range(steps):
        phi = 0.1 + 0.8 * s / max(1, steps - 1)
        rows += [
            (s, "phi/mean", phi, now),
            (s, "phi/p10", phi - 0.05, now),
            (s, "phi/p90", phi + 0.05, now),
            (s, "phi/entropy", (1 - phi) * math.log(V), now),
            (s, "rewards/task/mean", 0.25, now),
            (s, "rewards/format/mean", 0.75, now),
            (s, "reward", 1.0, now),
            (s, "loss", 1.0 / (s + 1), now),
        ]
    store.add_metrics(run_id, rows)
    return run_id


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def chart_text(chart: Chart) -> str:
    return "\n".join(chart.render_line(y).text for y in range(chart.size.height))


async def test_panes_show_a_known_run(home: Path) -> None:
    with Store(home / "carl.db") as store:
        make_run(store, "older", 10)
        run_id = make_run(store, "tiny-grpo", 50, max_steps=200)
        store.update_run(
            run_id,
            phase="crystallizing",
            health="yellow",
            health_reasons=["entropy collapsed from 5.6 to 1.1 nats"],
        )
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "tiny-grpo")
        status = status_text(app)
        assert "tiny-grpo" in status and "step 49/200" in status
        # 80 columns hold state, step, health (its reason cut to fit) and engine; the phase drops first here
        assert "yellow" in status and "entropy collapsed" in status and "engine" in status
        assert app.main.view.run.phase == "crystallizing"
        phi_title = str(app.query_one("#phi-chart").border_title)
        assert (
            "Φ coherence 0.9000" in phi_title
            and "H 0.624 nats" in phi_title
            and "p10–p90 0.850–0.950" in phi_title
        )
        phi_chart = app.query_one("#phi-chart", Chart)
        text = chart_text(phi_chart)
        assert any("\u2800" < ch <= "\u28ff" for ch in text), "the Phi chart draws braille"
        bars = app.query_one(RewardBars)
        assert [name for name, _ in bars._values] == ["format", "task", "total"]
        rendered = bars.render().plain
        assert "+0.750" in rendered and "+0.250" in rendered and "+1.000" in rendered
        assert app.query_one("#trajectories").rows == [] and TRAJECTORIES_EMPTY.splitlines()[0] in str(
            app.query_one("#trajectories").render()
        )
        assert AGENTS_EMPTY.splitlines()[0] in str(app.query_one("#agents").render())
        run_list = app.query_one(RunList)
        assert run_list.option_count == 2 and run_list.highlighted == 0  # newest first, selected


async def test_keys_move_filter_help_theme_and_maximize(home: Path) -> None:
    with Store(home / "carl.db") as store:
        make_run(store, "alpha", 5)
        make_run(store, "beta", 5)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "beta")
        await pilot.press("j")
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "alpha")
        await pilot.press("k")
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "beta")
        await pilot.press("slash")
        await pilot.press(*"alp")
        assert app.query_one(RunList).option_count == 1
        await pilot.press("escape")
        assert app.query_one(RunList).option_count == 2
        await pilot.press("question_mark")
        assert app.screen.__class__.__name__ == "HelpScreen"
        help_text = " ".join(f"{key} {description}" for key, description in app.screen.rows)
        for description in ("Filter runs", "Observe", "Theme", "Quit", "Help"):
            assert description in help_text
        await pilot.press("escape")
        assert app.screen.__class__.__name__ != "HelpScreen"
        theme = app.theme
        await pilot.press("t")
        assert app.theme != theme
        assert load_config(home).theme == app.theme  # remembered in the user config
        await pilot.press("b")
        assert app.query_one("#phi-chart", Chart).mode == "block" and load_config(home).chart_mode == "block"
        await pilot.press("1")
        assert not app.query_one("#rewards-pane").display or app.query_one("#rewards-pane").region.height == 0
        await pilot.press("1")
        assert app.query_one("#rewards-pane").region.height > 0
        await pilot.press("q")
    assert app.return_code == 0 or app.return_code is None


async def test_live_updates_reach_the_screen(home: Path) -> None:
    with Store(home / "carl.db") as store:
        run_id = make_run(store, "live", 20, max_steps=100)
        app = ControlRoom(home, start_engine=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: "step 19/100" in status_text(app))
            for step in range(20, 26):
                store.add_metrics(
                    run_id,
                    [(step, "phi/mean", 0.95, time.time()), (step, "rewards/task/mean", 0.5, time.time())],
                )
                await asyncio.sleep(0.05)
            await until(pilot, lambda: "step 25/100" in status_text(app))
            assert app.main.view is not None and app.main.view.latest("phi/mean") == 0.95
            await until(pilot, lambda: "ETA" in status_text(app))


async def test_empty_store_and_no_store(home: Path) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        assert "no run selected" in status_text(app)
        assert "no Φ data yet" in chart_text(app.query_one("#phi-chart", Chart))
        Store(home / "carl.db").close()  # the store appears later (the engine creates it)
        with Store(home / "carl.db") as store:
            make_run(store, "late", 3)
        await until(pilot, lambda: "late" in status_text(app))


async def test_a_newer_store_is_reported_not_touched(home: Path) -> None:
    Store(home / "carl.db").close()
    conn = sqlite3.connect(home / "carl.db")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "newer than this carl-tui" in status_text(app))


async def test_bad_config_is_one_line_and_left_alone(home: Path) -> None:
    (home / "tui.toml").write_text('theme = "no-such-theme"\n')
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.config_error and "tui.toml: theme:" in app.config_error
        await pilot.press("t")
    assert (home / "tui.toml").read_text() == 'theme = "no-such-theme"\n'


async def test_observe_dialog_rejects_a_bad_path_and_queues_a_good_one(home: Path, tmp_path: Path) -> None:
    Store(home / "carl.db").close()
    good = tmp_path / "metrics.jsonl"
    good.write_text('{"step": 1, "loss": 0.5}\n')
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("o")
        assert app.screen.__class__.__name__ == "ObserveScreen"
        await pilot.press(*str(tmp_path / "missing.jsonl"), "enter")
        error = str(app.screen.query_one("#observe-error").render())
        assert "missing.jsonl" in error
        app.screen.query_one("#observe-path").value = str(good)
        await pilot.press("enter")
        await until(pilot, lambda: app.screen.__class__.__name__ != "ObserveScreen")
        # written by the sender's thread: the row has its id (not raced by the app's exit)
        await until(pilot, lambda: any(r.verb == "observe" and r.command_id for r in app.sender.pending))
    with Store(home / "carl.db") as store:
        rows = store.conn.execute("SELECT verb, args, state, origin FROM commands").fetchall()
    assert (
        len(rows) == 1
        and rows[0][0] == "observe"
        and str(good) in rows[0][1]
        and rows[0][2:] == ("pending", "tui")
    )


async def test_readonly_refuses_to_write(home: Path, tmp_path: Path) -> None:
    Store(home / "carl.db").close()
    app = ControlRoom(home, start_engine=False, readonly=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("o")
        assert app.screen.__class__.__name__ != "ObserveScreen"
        assert "read-only" in status_text(app)


async def test_two_control_rooms_on_one_store(home: Path) -> None:
    with Store(home / "carl.db") as store:
        run_id = make_run(store, "shared", 5)
        first, second = ControlRoom(home, start_engine=False), ControlRoom(home, start_engine=False)
        async with first.run_test(size=(80, 24)) as p1, second.run_test(size=(80, 24)) as p2:
            await until(p1, lambda: "step 4" in status_text(first))
            await until(p2, lambda: "step 4" in status_text(second))
            store.add_metrics(run_id, [(5, "phi/mean", 0.5, time.time())])
            await until(p1, lambda: "step 5" in status_text(first))
            await until(p2, lambda: "step 5" in status_text(second))


async def test_a_held_out_eval_shows_in_the_status_line_and_on_e(home: Path) -> None:
    from carl_tui.screens import EvalScreen

    with Store(home / "carl.db") as store:
        run_id = make_run(store, "graded", 20, status="finished")
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.name == "graded")
        assert "eval" not in status_text(app)
        await pilot.press("e")  # no eval yet, and an observed run has no held-out split to make one
        await until(pilot, lambda: any("not trained by carl" in n.message for n in app._notifications))
        with Store(home / "carl.db") as store:  # an eval lands while the room is open
            store.add_eval(
                run_id,
                False,
                {"task": 0.31, "format": 0.9, "phi": 0.95, "prompts": 39},
                ["mean task reward 0.310 < 0.5", "format-compliant answers 0.900 >= 0.8"],
            )
        await until(pilot, lambda: "eval ✕ 0.31" in status_text(app))
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, EvalScreen))
        await pilot.pause()
        shown = " ".join(
            s.render_line(y).text for s in app.screen.query("Static") for y in range(s.size.height)
        )
        assert "failed" in shown and "mean task reward 0.310 < 0.5" in shown and "39" in shown
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, EvalScreen))
