"""The first frame loads only what it draws (issue 14 §1): the Φ and Rewards charts of the selected
run, the run list, the status line and the activity panes. The comparison's legend (hidden until
two runs are marked), the TOML reader and writer (no tui.toml yet; the start writes nothing), the
diagnosis chat, the trajectory and agent-task screens and the modal screens are imported when
first used, not at start-up; numpy is not imported at all (the store reads lists and the chart
reduces them in plain Python). Checked in a fresh interpreter, so other tests' imports do not count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from support import ROOT, until
from textual.widgets._footer import FooterKey

from carl_tui.app import ControlRoom
from engine.store import Store

DEFERRED = (
    "widgets.legend",  # the comparison's legend: mounted when two runs are marked
    "tomllib",  # reading tui.toml: this home has none
    "tomli_w",  # writing tui.toml: only a change of theme or chart mode writes it
    "carl_tui.chat_screen",  # `d`: the diagnosis chat, its SDK and its widgets
    "widgets.chat_log",
    "engine.diagnosis",
    "anthropic",
    "textual.widgets._markdown",
    "textual.widgets._text_area",
    "carl_tui.trajectory_screen",  # enter on a trajectory
    "carl_tui.agent_task_screen",  # enter on an agent task
    "carl_tui.screens",  # help, observe, eval, confirmations and value prompts
    "carl_tui.system_view",  # `S`: the System screen, its reader and its charts over wall time
    "carl_tui.system_model",
    "widgets.time_chart",
    "numpy",  # the store reads lists and the chart draws them in plain Python (widgets/raster.py)
    "engine.redact",  # its patterns: only a writer of chat messages or process rows redacts (issue 30)
    "engine.store.rollout_reads",  # the rollouts viewer's filter grammar and queries: `R`
)

FIRST_PAINT = """
import asyncio, json, sys, time
from pathlib import Path

from carl_tui.app import ControlRoom
from widgets.chart import Chart

home = Path(sys.argv[1])
deferred = json.loads(sys.argv[2])


def drawn(phi: Chart) -> bool:
    return any("\\u2801" <= c <= "\\u28ff" for y in range(phi.size.height) for c in phi.render_line(y).text)


async def main() -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        phi = app.query_one("#phi-chart", Chart)
        for _ in range(200):  # the first frame has it unless the store read outlived on_mount's wait
            await pilot.pause(0.05)
            if drawn(phi):
                break
        print(json.dumps({
            "drawn": drawn(phi),
            "loaded": [m for m in deferred if m in sys.modules],
            "widgets": sorted({type(w).__name__ for w in app.screen.walk_children()}),
        }))


asyncio.run(main())
"""


def test_the_first_frame_imports_and_mounts_only_what_it_draws(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with Store(home / "carl.db") as store:  # written here: the writer's own imports (numpy) do not count
        run_id = store.create_run("first-paint", source_kind="jsonl", max_steps=100, vocab_size=512)
        store.add_metrics(
            run_id,
            [
                (s, key, 0.5 + s / 200, time.time())
                for s in range(50)
                for key in ("phi/mean", "phi/p10", "phi/p90", "rewards/task/mean", "reward")
            ],
        )
    out = subprocess.run(
        [sys.executable, "-c", FIRST_PAINT, str(home), json.dumps(DEFERRED)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    )
    first = json.loads(out.stdout.strip().splitlines()[-1])
    assert first["drawn"], "the first frame shows the run's Φ chart"
    assert first["loaded"] == []
    assert "Legend" not in first["widgets"]
    assert {"Chart", "RunList", "StatusBar", "TrajectoriesPane", "AgentsPane", "SystemPane"} <= set(
        first["widgets"]
    )


async def test_the_key_bar_follows_the_first_frame(tmp_path: Path) -> None:
    """Textual's Footer composes its keys once the bindings are published, after the first refresh;
    they must come, with the control room's keys, without any key pressed."""
    app = ControlRoom(tmp_path, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.query(FooterKey)) > 0)
        keys = [key.description for key in app.query(FooterKey)]
        assert {"Help", "Observe", "Pause", "Quit"} <= set(keys), keys


async def test_the_collector_is_back_on_after_the_first_frame(tmp_path: Path) -> None:
    """`carl-tui` starts with the cyclic garbage collector off (launch.py: start-up allocates a lot and
    frees next to nothing, and a collection landed in the middle of the first chart); the control
    room turns it back on after its first frame, with what start-up built frozen out of it."""
    import gc

    gc.disable()  # as carl-tui's entry does
    try:
        app = ControlRoom(tmp_path, start_engine=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, gc.isenabled)
            assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()
