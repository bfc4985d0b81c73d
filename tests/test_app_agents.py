"""The Agents pane through Pilot, against a store filled by the real audit writer from real plane
events: workers and events newest first, alarms in the theme's error colour, rejected payloads with
their reason, the task screen, the keys that send engine commands, read-only, the status bar's NATS
segment and live redraws. At 80x24 and at 160x50."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from rich.style import Style
from support import status_text, until
from test_app_control import settled
from textual.color import Color
from textual.content import Content

from carl_tui.agent_task_screen import AgentTaskScreen
from carl_tui.app import ControlRoom
from engine.agents.audit import AuditWriter, Incoming
from engine.agents.events import (
    AlarmEvent,
    FeedbackEvent,
    ManagerStatusEvent,
    ModelUpdateEvent,
    PlaneEvent,
    ResultEvent,
    TaskEvent,
    TrainingRolloutEvent,
    WorkerStatusEvent,
)
from engine.store import Store
from widgets.agents import AgentsPane

SIZES = [(80, 24), (160, 50)]
_seq = itertools.count(1)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def audit(home: Path, *items: PlaneEvent | tuple[str, bytes]) -> None:
    """Store events the way the engine's bridge does: through the audit writer, one batch."""
    batch = []
    for item in items:
        seq = next(_seq)
        subject, data = (item.subject(), item.encode()) if isinstance(item, PlaneEvent) else item
        batch.append(Incoming(subject, data, seq, f"test:{seq}"))
    with Store(home / "carl.db") as store:
        AuditWriter(store).write(batch)


def plane_up(home: Path, state: str = "up", wanted: bool = True) -> None:
    """The kv rows the engine's plane writes (engine/agents/plane.py)."""
    with Store(home / "carl.db") as store:
        store.set_kv(
            "agents.server",
            {
                "state": state,
                "url": "nats://127.0.0.1:4333",
                "port": 4333,
                "restarts": 0,
                "local": True,
                "bridge": "connected",
            },
        )
        store.set_kv(
            "agents.plane",
            {
                "wanted": wanted,
                "spec": {"workers": 2, "tasks": "demo"},
                "processes": [{"role": "manager", "id": "manager", "state": "running"}],
            },
        )


def worker(worker_id: str, state: str = "idle", task_id: str | None = None, **kw: Any) -> WorkerStatusEvent:
    return WorkerStatusEvent(
        worker_id=worker_id,
        kind="model",
        task_types=["demo"],
        model="tiny",
        model_version=kw.pop("model_version", "base"),
        state=state,
        task_id=task_id,
        host="box",
        pid=100,
        **kw,
    )


def one_task(worker_id: str = "w1", prompt: str = "What is 17 + 25?") -> tuple[str, list[PlaneEvent]]:
    """A task, its result with three steps, the rollout the manager scored it into, and feedback."""
    task = TaskEvent(
        manager_id="manager",
        task_type="demo",
        prompt=prompt,
        reference="42",
        verifier="demo",
        group_id="g-1234567890",
        group_size=2,
    )
    steps = ["Add the tens: 10 + 20 = 30", "Add the units: 7 + 5 = 12", "30 + 12 = 42"]
    result = ResultEvent(
        task_id=task.task_id,
        worker_id=worker_id,
        task_type="demo",
        prompt=prompt,
        status="success",
        result="...",
        steps=steps,
        answer="42",
        elapsed_seconds=1.5,
        model_version="agents-v0003",
        worker_kind="model",
        response_token_ids=[1, 2, 3, 4],
        token_logprobs=[-0.5, -0.25, -0.1, -0.05],
        temperature=0.7,
        phi_mean=0.91,
    )
    rollout = TrainingRolloutEvent(
        task_id=task.task_id,
        worker_id=worker_id,
        task_type="demo",
        group_id="g-1234567890",
        group_size=2,
        prompt=prompt,
        response="...",
        steps=steps,
        step_scores=[0.9, 0.35, 0.8],
        prm_score=0.68,
        outcome_score=0.75,
        profile="chat",
        dimensions={"prm": 0.68, "halugate": 1.0, "length": 0.9},
        verifier_score=1.0,
        reward=0.83,
        model_version="agents-v0003",
        response_token_ids=[1, 2, 3, 4],
        token_logprobs=[-0.5, -0.25, -0.1, -0.05],
        temperature=0.7,
    )
    feedback = FeedbackEvent(
        task_id=task.task_id,
        manager_id="manager",
        worker_id=worker_id,
        score=0.8,
        textual_feedback="Right answer; the second step could show the carry.",
    )
    return task.task_id, [
        task,
        worker(worker_id, "busy", task.task_id),
        result,
        rollout,
        feedback,
        worker(worker_id, "idle", tasks_done=1, model_version="agents-v0003"),
    ]


def fill(home: Path) -> str:
    """A plane with two workers, one scored task, a model update, an alarm and a rejected payload."""
    plane_up(home)
    task_id, events = one_task()
    audit(home, worker("w1"), worker("w2"), *events)
    audit(home, ManagerStatusEvent(manager_id="manager", state="assigning", assigned=3, in_flight=1, done=1))
    audit(
        home,
        ModelUpdateEvent(model_version="agents-v0004", checkpoint_path="/tmp/a", base_model="tiny", step=4),
    )
    audit(home, ("results.demo", json.dumps({"type": "result", "task_id": "t", "bogus": 1}).encode()))
    audit(
        home,
        AlarmEvent(kind="collusion", reason="w1 and w2 gave identical answers to 5 tasks", worker_id="w2"),
    )
    return task_id


def pane_lines(app: ControlRoom) -> list[str]:
    pane = app.query_one(AgentsPane)
    return [pane.render_line(y).text for y in range(pane.size.height)]


def shown(app: ControlRoom) -> str:
    return "\n".join(pane_lines(app))


def pane_title(app: ControlRoom) -> str:
    return Content.from_markup(app.query_one("#agents").border_title).plain


def pane_subtitle(app: ControlRoom) -> str:
    subtitle = app.query_one("#agents").border_subtitle
    return Content.from_markup(subtitle).plain if subtitle else ""


def commands(home: Path) -> list[tuple[str, dict, str]]:
    with Store(home / "carl.db") as store:
        rows = store.conn.execute("SELECT verb, args, target FROM commands ORDER BY id").fetchall()
    return [(verb, json.loads(args), target) for verb, args, target in rows]


async def focus_agents(app: ControlRoom, pilot: Any, maximize: bool) -> AgentsPane:
    pane = app.query_one(AgentsPane)
    await until(pilot, lambda: bool(pane.agent_events))
    pane.focus()
    if maximize:
        await pilot.press("4")
    await pilot.pause()
    return pane


@pytest.mark.parametrize("size", SIZES)
async def test_the_pane_shows_workers_and_events_newest_first(home: Path, size: tuple[int, int]) -> None:
    fill(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        pane = await focus_agents(app, pilot, maximize=False)
        text = shown(app)
        assert "collusion" in text  # the newest event is on top, even in the small pane
        assert "w1" in text and "w2" in text  # the workers, folded or as a table
        full = "Agents · nats ● up · ⚠ 1 alarm · 2 workers · 1/∞ tasks · model agents-v0004"
        if size == (80, 24):  # a small pane: what needs attention in its title, the counts below
            assert pane_title(app) == "Agents · ⚠ 1 alarm"
            assert pane_subtitle(app) == "model agents-v0004 · 1/∞ tasks"
        else:
            assert pane_title(app) == full and pane_subtitle(app) == ""
        assert "nats ● up" in status_text(app)
        await pilot.press("4")  # maximized: the workers table and the whole stream
        await pilot.pause()
        assert pane_title(app) == full
        lines = pane_lines(app)
        header = next(i for i, line in enumerate(lines) if line.startswith("worker"))
        assert lines[header + 1].startswith("w1") and lines[header + 2].startswith("w2")
        assert "v0003" in lines[header + 1]  # its model version (agents-v0003: its step, when narrow)
        assert " 1 " in lines[header + 1] and "100%" in lines[header + 1]  # one task done, all succeeded
        assert "0.83" in lines[header + 1]  # its mean score: the reward the manager gave
        assert lines[header + 3].startswith("events · newest first")
        events = [line.split() for line in lines[header + 4 :] if line.strip()]
        kinds = [words[1] for words in events]
        assert kinds[0] in ("⚠", "alarm")  # a narrow pane gives the alarm's reason the kind's column
        assert kinds[1:] == [
            "result",
            "model",
            "manager",
            "status",
            "feedback",
            "rollout",
            "result",
            "status",
            "task",
            "status",
            "status",
        ]
        assert "⚠ collusion" in lines[header + 4] and "w1 and w2 gave" in lines[header + 4]
        assert "result   rejected: worker_id: Field" in lines[header + 5]
        assert "→ agents-v0004" in lines[header + 6]
        assert events[6][-1] == "0.83" or "0.83" in events[6]  # the rollout's reward
        assert pane.agent_events[0]["kind"] == "alarm" and pane.agent_events[-1]["kind"] == "worker_status"


async def test_an_alarm_is_drawn_in_the_themes_error_colour(home: Path) -> None:
    fill(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        pane = await focus_agents(app, pilot, maximize=False)
        error = Color.parse(app.current_theme.error).rich_color
        y = next(y for y, line in enumerate(pane_lines(app)) if "collusion" in line)
        colours = {
            seg.style.color
            for seg in pane.render_line(y)
            if seg.text.strip() and isinstance(seg.style, Style)
        }
        assert error in colours
        await pilot.press("enter")  # the cursor is on the newest event, the alarm: its whole reason
        await until(
            pilot, lambda: any("identical answers to 5 tasks" in n.message for n in app._notifications)
        )
        y = next(y for y, line in enumerate(pane_lines(app)) if "model" in line and "→" in line)
        colours = {
            seg.style.color
            for seg in pane.render_line(y)
            if seg.text.strip() and isinstance(seg.style, Style)
        }
        assert error not in colours


@pytest.mark.parametrize("size", SIZES)
async def test_enter_opens_the_task_with_its_steps_feedback_and_rollout(
    home: Path, size: tuple[int, int]
) -> None:
    task_id = fill(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        pane = await focus_agents(app, pilot, maximize=True)
        # The first enter opens a task: the cursor rests on the newest event of one, not on a status line.
        assert pane.highlighted_task() == task_id
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, AgentTaskScreen))
        await pilot.pause()
        body = app.screen.query_one("#task-body")
        text = " ".join(" ".join(body.render_line(y).text for y in range(body.size.height)).split())
        for expected in (
            "What is 17 + 25?",
            "Add the tens",
            "0.90",
            "0.35",
            "0.80",
            "42",
            "carry",
            "offline",
            "worker w1",
            "agents-v0003",
            "4 tokens",
            "temperature 0.7",
            "group g-123456",
            "0.83",
            "Φ mean 0.910",
            "1.5s",
            "the chat profile",
            "scored on prm 0.68 · halugate 1.00 · length 0.90",
        ):
            assert expected in text, expected
        scroll = app.screen.query_one("#task-detail")
        assert (
            scroll.region.right <= size[0] and scroll.region.bottom <= size[1]
        )  # it fits; it scrolls inside
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, AgentTaskScreen))


@pytest.mark.parametrize("size", SIZES)
async def test_keys_queue_engine_commands_and_report_the_outcome(home: Path, size: tuple[int, int]) -> None:
    fill(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        pane = await focus_agents(app, pilot, maximize=True)
        await pilot.press("p")
        await settled(pilot)
        assert commands(home) == [("agents_pause", {}, "engine")]
        with Store(home / "carl.db") as store:  # the plane answers: the audit finishes the command
            command_id = store.conn.execute("SELECT max(id) FROM commands").fetchone()[0]
        audit(
            home,
            ManagerStatusEvent(
                manager_id="manager",
                state="paused",
                done=1,
                command_id=command_id,
                detail="no new tasks until resumed",
            ),
        )
        await until(pilot, lambda: any("manager paused" in n.message for n in app._notifications))
        await until(pilot, lambda: "paused" in pane_title(app))
        await pilot.press("p")  # paused: p resumes
        await settled(pilot)
        assert commands(home)[-1] == ("agents_resume", {}, "engine")
        await pilot.pause(0.1)
        await pilot.press("plus")
        await settled(pilot)
        assert commands(home)[-1] == ("agents_add_worker", {}, "engine")
        for key in ["up"] * 40 + ["down"] * 80:  # to a row of w2's, wherever the cursor rests
            if pane.highlighted_worker() == "w2":
                break
            await pilot.press(key)
        assert pane.highlighted_worker() == "w2"
        await pilot.press("x")
        assert app.screen.__class__.__name__ == "ConfirmScreen"
        await pilot.press("escape")  # cancelled: nothing sent
        await settled(pilot)
        assert len(commands(home)) == 3
        await pilot.pause(0.35)  # destructive keys are debounced
        await pilot.press("x")
        await pilot.pause(0.35)
        await pilot.press("x")  # the same key again confirms, and asks nothing more
        stop = ("agents_stop_worker", {"worker_id": "w2"}, "engine")
        await until(pilot, lambda: commands(home)[-1] == stop)
        await pilot.pause(0.1)
        assert app.screen.__class__.__name__ == "MainScreen" and len(commands(home)) == 4


async def test_keys_say_so_when_the_plane_is_down(home: Path) -> None:
    fill(home)
    plane_up(home, state="stopped", wanted=False)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await focus_agents(app, pilot, maximize=False)
        await pilot.press("p")
        await until(pilot, lambda: any("not up" in n.message for n in app._notifications))
        await settled(pilot)
        assert commands(home) == []
        assert "nats" not in status_text(app)


async def test_readonly_hides_the_control_keys(home: Path) -> None:
    fill(home)
    app = ControlRoom(home, start_engine=False, readonly=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await focus_agents(app, pilot, maximize=False)
        bound = {entry.binding.key for entry in app.screen.active_bindings.values()}
        assert "enter" in bound and not {"p", "plus", "x"} & bound
        await pilot.press("p", "plus", "x")
        await settled(pilot)
        assert commands(home) == [] and app.screen.__class__.__name__ == "MainScreen"
        await pilot.press("question_mark")
        descriptions = " ".join(description for _, description in app.screen.rows)
        assert "Open the highlighted row's task" in descriptions and "Add a worker" not in descriptions


async def test_help_lists_the_pane_keys(home: Path) -> None:
    fill(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await focus_agents(app, pilot, maximize=False)
        await pilot.press("question_mark")
        rows = {description: key for key, description in app.screen.rows}
        assert rows["Open the highlighted row's task (an alarm: its whole reason)"] == "⏎"
        assert rows["Pause or resume task assignment"] == "p" and rows["Add a worker"] == "+"
        assert rows["Stop the highlighted worker (asks first)"] == "x"


@pytest.mark.parametrize("size", SIZES)
async def test_new_events_redraw_the_pane(home: Path, size: tuple[int, int]) -> None:
    fill(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await focus_agents(app, pilot, maximize=False)
        assert "stuck_worker" not in shown(app)
        audit(home, AlarmEvent(kind="stuck_worker", reason="w1 busy for 300s", worker_id="w1"))
        await until(pilot, lambda: "stuck_worker" in shown(app))
        await until(pilot, lambda: "⚠ 2 alarms" in pane_title(app))
        plane_up(home, state="restarting")
        await until(pilot, lambda: "nats ◌ restarting" in status_text(app))


def serve(home: Path, serving: dict[str, Any]) -> None:
    """The plane's kv row as the engine's plane writes it while it serves a run (engine/agents/plane.py)."""
    with Store(home / "carl.db") as store:
        store.set_kv("agents.plane", {**(store.kv("agents.plane") or {}), "serving": serving})


async def test_the_title_says_which_run_and_step_the_plane_serves(home: Path) -> None:
    fill(home)
    serve(home, {"run": "demo", "state": "waiting", "step": None, "detail": "run demo has no checkpoint yet"})
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await focus_agents(app, pilot, maximize=False)
        await until(pilot, lambda: "· serving base · demo not saved yet · 2 workers ·" in pane_title(app))
        serve(home, {"run": "demo", "state": "serving", "step": 1050, "detail": "serving demo-v1050"})
        # The served run comes before the counts, so that a narrow pane's title still shows it.
        await until(
            pilot, lambda: pane_title(app).endswith("· serving demo step 1,050 · 2 workers · 1/∞ tasks")
        )
        serve(
            home, {"run": "demo\x1b[2J", "state": "refused", "step": None, "detail": "trains another model"}
        )
        await until(pilot, lambda: "not serving demo" in pane_title(app))
        assert "\x1b" not in pane_title(app)


async def test_an_empty_store_says_how_to_start_the_plane(home: Path) -> None:
    Store(home / "carl.db").close()
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.3)
        assert "carl agents up" in shown(app)
        assert "nats" not in status_text(app)


def test_the_watcher_reads_the_plane_only_when_it_moved(home: Path) -> None:
    from carl_tui.model import StoreWatcher

    fill(home)
    watcher = StoreWatcher(home / "carl.db")
    first = watcher.poll()
    assert first is not None and first.agent_workers is not None and first.agent_overview is not None
    assert first.agent_events[0]["alarm_kind"] == "collusion" and first.agent_count == 12
    assert watcher.poll() is None  # nothing moved: one data_version read
    with Store(home / "carl.db") as store:  # a change elsewhere in the store: the plane is not read again
        store.create_run("other", source_kind="jsonl")
    later = watcher.poll()
    assert later is not None and later.agent_events is None
    plane_up(home, state="restarting")  # only the plane's state moved
    moved = watcher.poll()
    assert moved is not None and moved.agent_overview["server"]["state"] == "restarting"


def card_text(app: ControlRoom) -> str:
    body = app.screen.query_one("#task-body")
    return " ".join(" ".join(body.render_line(y).text for y in range(body.size.height)).split())


@pytest.mark.parametrize("size", SIZES)
async def test_the_task_card_follows_its_task_and_says_one_thing_about_its_worker(
    home: Path, size: tuple[int, int]
) -> None:
    """Opened while w1 answers: w1 has it (not "no worker yet" beside w1's events); then the result, the
    scores and the feedback arrive and the open card shows them."""
    plane_up(home)
    task_id, events = one_task()
    task, busy, *later = events
    audit(home, worker("w1"), task, busy)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        pane = await focus_agents(app, pilot, maximize=True)
        assert pane.highlighted_task() == task_id
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, AgentTaskScreen))
        await until(pilot, lambda: "What is 17 + 25?" in card_text(app))
        text = card_text(app)
        assert "worker w1 · answering" in text and "no worker yet" not in text
        assert "none yet" in text  # no steps yet
        audit(home, *later)  # the result, its rollout, the manager's feedback, w1 idle again
        await until(pilot, lambda: "carry" in card_text(app))
        text = card_text(app)
        assert "worker w1" in text and "answering" not in text
        for expected in ("Add the tens", "0.83", "agents-v0003", "4 tokens"):
            assert expected in text, expected
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, AgentTaskScreen))


def test_the_watcher_reads_the_open_task_again_only_when_its_rows_moved(home: Path) -> None:
    from carl_tui.model import StoreWatcher

    plane_up(home)
    task_id, events = one_task()
    other_id, others = one_task("w2", "What is 2 + 2?")
    audit(home, worker("w1"), worker("w2"), *events[:2])
    watcher = StoreWatcher(home / "carl.db")
    assert watcher.poll() is not None
    watcher.watch_task(task_id)
    opened = watcher.poll()
    assert opened is not None and opened.agent_task is not None and opened.agent_task["task_id"] == task_id
    assert watcher.poll() is None  # nothing moved
    audit(home, *others)  # another task's events: the plane is read again, this task is not
    elsewhere = watcher.poll()
    assert elsewhere is not None and elsewhere.agent_events is not None and elsewhere.agent_task is None
    audit(home, events[2])  # this task's result
    moved = watcher.poll()
    assert moved is not None and moved.agent_task is not None and moved.agent_task["answer"] == "42"
    watcher.watch_task(None)  # the card closed
    assert watcher.poll() is not None  # (the request is read once)
    audit(home, *events[3:])
    closed = watcher.poll()
    assert closed is not None and closed.agent_task is None
