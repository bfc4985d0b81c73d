"""On-policy distillation in the control room, through Pilot on a store filled by the real audit writer from
real plane events and by the store's own `record_task_opd`: the task card's hint (with its source), the
answer's tokens coloured by their OPD advantage on the diverging scale, its legend and the KL line, followed
live while the card is open; the Agents pane's line on how the manager is judged, exactly the means, absent
until it is judged, redrawn when a judgement arrives. At 80x24 and at 160x50."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import until
from test_app_agents import SIZES, audit, card_text, focus_agents, one_task, pane_lines, plane_up, worker

from carl_tui.agent_task_screen import AgentTaskScreen
from carl_tui.app import ControlRoom
from carl_tui.rollouts_detail import token_styles
from engine.agents.events import HintEvent, JudgedKind, ManagerJudgedEvent
from engine.store import Store
from engine.store.agent_audit import record_task_opd
from engine.store.rollouts import pack_half
from widgets.agents import manager_line
from widgets.token_text import OPD_ADVANTAGE

HINT = "Answer with one JSON tool call to get_time with the city Paris."
# The answer's tokens and their OPD advantages: each a different step of the scale, both ends included. The
# values are exact in float16, so that the stored advantages come back as written.
TOKENS = ['{"', "tool", '": "', "get", "_weather", '"}']
ADVANTAGES = [0.0, 0.125, -0.25, 0.875, -0.75, 0.03125]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def hinted_task(home: Path) -> str:
    """A task answered by w1, scored, given feedback and then a hint made from the verifier's failure."""
    plane_up(home)
    task_id, events = one_task()
    hint = HintEvent(
        task_id=task_id,
        manager_id="manager",
        worker_id="w1",
        hint=HINT,
        source="verifier",
        signal="expected tool get_time, got get_weather",
    )
    audit(home, worker("w1"), *events, hint)
    return task_id


def distil(home: Path, task_id: str, step: int = 14, kl: float = 0.12) -> None:
    """What the plane's trainer writes once it distilled from the hint."""
    with Store(home / "carl.db") as store:
        record_task_opd(store, [(task_id, step, json.dumps(TOKENS), pack_half(ADVANTAGES), kl)])


def judge(home: Path, task_id: str, kind: JudgedKind, *values: float) -> None:
    """The manager judged, as manager_judge.py publishes it: one event per value."""
    events = [
        ManagerJudgedEvent(task_id=task_id, manager_id="manager", worker_id="w1", kind=kind, value=v)
        for v in values
    ]
    audit(home, *events)


async def open_card(app: ControlRoom, pilot: Any, task_id: str) -> None:
    pane = await focus_agents(app, pilot, maximize=True)
    assert pane.highlighted_task() == task_id
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, AgentTaskScreen))
    await until(pilot, lambda: "What is 17 + 25?" in card_text(app))


def opd_segments(app: ControlRoom) -> list[tuple[str, Any]]:
    """The card's OPD line as drawn: each segment's text and colour triplet."""
    body = app.screen.query_one("#task-body")
    y = next(y for y in range(body.size.height) if body.render_line(y).text.lstrip().startswith("OPD"))
    return [
        (seg.text, seg.style.color.triplet if seg.style and seg.style.color else None)
        for seg in body.render_line(y)
    ]


@pytest.mark.parametrize("size", SIZES)
async def test_the_card_shows_the_hint_then_the_answers_opd_colours_and_kl(
    home: Path, size: tuple[int, int]
) -> None:
    task_id = hinted_task(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await open_card(app, pilot, task_id)
        text = card_text(app)
        assert f"hint (verifier) {HINT}" in text  # the label, the source (dim), the hint
        assert "teacher/student KL" not in text and "OPD" not in text  # not distilled yet
        distil(home, task_id)  # the trainer distils while the card is open: the card follows
        await until(pilot, lambda: "teacher/student KL" in card_text(app))
        text = card_text(app)
        assert "teacher/student KL 0.12 nats · step 14" in text
        assert f"OPD {''.join(TOKENS)}" in text
        assert "<-0.5 ██████████████ ≥+0.5 nats · + liked more with the hint" in text
        scale = [style.color.triplet if style.color else None for style in token_styles(app, OPD_ADVANTAGE)]
        assert scale[3] is None and len({c for c in scale if c is not None}) == 6  # plain in the middle
        drawn = opd_segments(app)
        for token, value in zip(TOKENS, ADVANTAGES, strict=True):
            colour = next(c for text, c in drawn if text.startswith(token))
            if abs(value) < 0.05:  # about zero: plain, in the card's own colour
                assert colour not in scale, token
            else:
                assert colour == scale[OPD_ADVANTAGE.level(value)], token
        scroll = app.screen.query_one("#task-detail")
        assert scroll.region.right <= size[0] and scroll.region.bottom <= size[1]
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, AgentTaskScreen))


def manager_lines(app: ControlRoom) -> list[str]:
    return [line.strip() for line in pane_lines(app) if line.strip().startswith("manager:")]


@pytest.mark.parametrize("size", SIZES)
async def test_the_pane_says_how_the_manager_is_judged_once_it_is(home: Path, size: tuple[int, int]) -> None:
    task_id = hinted_task(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        pane = await focus_agents(app, pilot, maximize=True)
        assert manager_lines(app) == []  # never judged: no line at all
        judge(home, task_id, "agreement", 0.9, 0.7, 0.65)
        await until(pilot, lambda: bool(manager_lines(app)))
        assert manager_lines(app) == [
            "manager: agrees with the verifier 0.75 (n=3)"
        ]  # (0.9 + 0.7 + 0.65) / 3
        shown = pane.shown
        judge(home, task_id, "hint_help", 0.25, -0.05)
        await until(pilot, lambda: pane.shown != shown and "hints" in " ".join(manager_lines(app)))
        if size[0] < 100:  # maximized at 80x24, a pane of 52 columns: the short words
            assert manager_lines(app) == ["manager: agrees 0.75 · hints +0.10"]
        else:
            assert manager_lines(app) == [
                "manager: agrees with the verifier 0.75 (n=3) · hints help +0.10 (n=2)"
            ]
        events = " ".join(pane_lines(app))  # each judgement's row says what it measured
        assert "hint help -0.05" in events and "agreement 0.65" in events
        await pilot.press("4")  # back in the row: 80x24 has no room for the line, 160x50 has, without counts
        await until(pilot, lambda: app.main.maximized_pane is None)
        if size[0] < 100:
            await until(pilot, lambda: pane.size.height < 10 and manager_lines(app) == [])
            assert any("judged" in line for line in pane_lines(app))  # the events keep their lines
        else:
            want = "manager: agrees with the verifier 0.75 · hints help +0.10"
            await until(pilot, lambda: manager_lines(app) == [want])


def test_the_manager_line_leaves_out_what_was_never_judged_and_fits_its_width() -> None:
    assert manager_line({}, 80) is None and manager_line(None, 80) is None
    only = manager_line({"hint_help": (-0.004, 12)}, 200)  # no "-0.00"
    assert only is not None and only.plain == "manager: hints help +0.00 (n=12)"
    both = {"agreement": (0.8234, 200), "hint_help": (0.0, 5)}
    for width, want in (
        (200, "manager: agrees with the verifier 0.82 (n=200) · hints help +0.00 (n=5)"),
        (60, "manager: agrees with the verifier 0.82 · hints help +0.00"),
        (40, "manager: agrees 0.82 · hints +0.00"),
    ):
        line = manager_line(both, width)
        assert line is not None and line.plain == want and line.cell_len <= width
