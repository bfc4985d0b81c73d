"""Hints from a result's directive signal, the manager judged, and harmful hints as collusion: the pure parts,
on real events; Claude's hints through the real anthropic SDK against the local Messages API server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from messages_server import MessagesServer

from engine.agents.alarms import AlarmMonitor
from engine.agents.events import HintEvent, ManagerJudgedEvent, ResultEvent, TaskEvent, parse_event
from engine.agents.feedback import Feedback
from engine.agents.hints import (
    HINT_TOKENS,
    ClaudeHints,
    OfflineHints,
    directive_signal,
    make_hint,
    parse_hint,
    verifier_message,
)
from engine.agents.manager_judge import ManagerJudge, similar_key
from engine.agents.plane_settings import AlarmSettings
from engine.agents.tasks import demo_tasks, verify
from engine.llm.claude import AsyncAsker
from engine.training import opd

KEY = "sk-ant-test-key-0123456789abcdef"
GOOD = Feedback.of({"correctness": 1.0, "completeness": 1.0, "quality": 1.0}, "Fine.", "offline")
POOR = Feedback.of(
    {"correctness": 0.2, "completeness": 0.5, "quality": 0.9},
    "Weakest is correctness (0.20): it names Lima, which the task does not. Scores: correctness 0.20.",
    "offline",
)


def demo_task(tool: str = "get_time", city: str | None = None) -> TaskEvent:
    spec = next(
        t
        for t in demo_tasks()
        if t.metadata["answer_tool"] == tool and (city is None or t.metadata["answer_city"] == city)
    )
    return spec.event("manager")


def result(task: TaskEvent, answer: str, **changes: Any) -> ResultEvent:
    fields: dict[str, Any] = {
        "task_id": task.task_id,
        "worker_id": "w1",
        "task_type": task.task_type,
        "status": "success",
        "result": answer,
        "answer": answer,
    }
    return ResultEvent(**{**fields, **changes})


def call(tool: str, city: str) -> str:
    return json.dumps({"tool": tool, "args": {"city": city}})


# -- the directive signal ------------------------------------------------------------------------------


def test_a_wrong_tool_gets_the_verifiers_message_and_an_offline_hint() -> None:
    task = demo_task("get_time")
    city = task.metadata["answer_city"]
    answer = call("get_weather", city)
    score = verify(task, answer)
    assert score is not None and score < 1
    signal = directive_signal(task, result(task, answer), score, GOOD)
    assert signal is not None and signal.source == "verifier"
    want = f"expected a call to get_time for {city}; got tool 'get_weather' (expected 'get_time')"
    assert signal.text == want


async def test_the_offline_hint_says_what_to_do() -> None:
    task = demo_task("find_hotels")
    city = task.metadata["answer_city"]
    answer = "I cannot help"
    hint = await make_hint(OfflineHints(), task, result(task, answer), verify(task, answer), GOOD)
    assert hint is not None and hint.source == "verifier"
    assert hint.text == f"Answer with one JSON tool call to find_hotels with the city {city}."
    assert "no parsable call" in hint.signal


async def test_a_right_answer_or_good_feedback_gets_no_hint() -> None:
    task = demo_task("get_time")
    right = call("get_time", task.metadata["answer_city"])
    assert verify(task, right) == 1.0
    assert await make_hint(OfflineHints(), task, result(task, right), 1.0, POOR) is None
    free = TaskEvent(manager_id="m", task_type="chat", prompt="Say hello.")  # no verifier
    assert await make_hint(OfflineHints(), free, result(free, "Hello."), None, GOOD) is None


async def test_without_a_verifier_the_advice_is_the_hint_and_a_failure_its_error() -> None:
    free = TaskEvent(manager_id="m", task_type="chat", prompt="Name the capital of Peru.")
    hint = await make_hint(OfflineHints(), free, result(free, "Lima is in Chile"), None, POOR)
    assert hint is not None and hint.source == "feedback"
    assert hint.text == "Weakest is correctness (0.20): it names Lima, which the task does not."
    failed = result(free, "tool crashed", status="failed", error="the tool timed out after 30s")
    hint = await make_hint(OfflineHints(), free, failed, None, POOR)
    assert hint is not None and hint.source == "error" and "timed out after 30s" in hint.text


def test_a_reference_check_says_what_it_expected() -> None:
    task = TaskEvent(manager_id="m", task_type="math", prompt="2+2?", reference="4", verifier="number")
    assert verifier_message(task, "5") == "number check failed: expected '4'; got '5'"


def test_claude_s_reply_is_read_between_the_markers_only() -> None:
    assert parse_hint("ok [HINT_START] Call get_time\n for Paris. [HINT_END]") == "Call get_time for Paris."
    assert parse_hint("NONE") is None and parse_hint("[HINT_START]  [HINT_END]") is None


async def test_claude_writes_the_hint_and_the_offline_one_stands_in_when_it_says_none(
    server: MessagesServer,
) -> None:
    task = demo_task("get_time")
    answer = call("get_weather", task.metadata["answer_city"])
    server.text(["[HINT_START]Use get_time: the user asked", " for the time.[HINT_END]"])
    hints = ClaudeHints(
        AsyncAsker(KEY, "claude-test", server.base_url, max_retries=0, max_tokens=HINT_TOKENS)
    )
    try:
        hint = await make_hint(hints, task, result(task, answer), verify(task, answer), GOOD)
        assert hint is not None and (hint.source, hint.text) == (
            "claude",
            "Use get_time: the user asked for the time.",
        )
        asked = server.requests[-1].json["messages"][0]["content"]
        assert "What was wrong (verifier)" in asked and "get_weather" in asked
        server.text(["NONE"])
        hint = await make_hint(hints, task, result(task, answer), verify(task, answer), GOOD)
        assert hint is not None and hint.source == "verifier" and hint.text.startswith("Answer with one JSON")
    finally:
        await hints.aclose()


# -- the events ----------------------------------------------------------------------------------------


def test_hint_and_judgement_events_travel_on_opd_subjects_and_refuse_bad_values() -> None:
    hint = HintEvent(task_id="t", manager_id="m", worker_id="w", hint="Do X.", source="verifier")
    assert hint.subject() == "opd.hints" and parse_event("opd.hints", hint.encode()) == hint
    judged = ManagerJudgedEvent(task_id="t", manager_id="m", worker_id="w", kind="hint_help", value=-0.5)
    assert parse_event("opd.judged", judged.encode()) == judged
    with pytest.raises(ValueError):
        ManagerJudgedEvent(task_id="t", manager_id="m", worker_id="w", kind="hint_help", value=1.5)
    with pytest.raises(ValueError):
        HintEvent(task_id="t", manager_id="m", worker_id="w", hint="", source="verifier")


# -- the manager judged ----------------------------------------------------------------------------------


def test_agreement_is_one_minus_the_gap_to_the_verifier() -> None:
    judged = ManagerJudge.agreement("t", "w", 0.9, 0.25)
    assert judged is not None and judged.value == pytest.approx(0.35)
    assert ManagerJudge.agreement("t", "w", 0.9, None) is None


def test_a_hint_is_judged_by_the_next_similar_attempt_assigned_after_it() -> None:
    judge = ManagerJudge()
    first, same_group, later = demo_task("get_time"), demo_task("get_time"), demo_task("get_time")
    other = demo_task("get_news")
    assert judge.attempt(first, "w1", 0.25, assigned_at=1.0, hinted_at=2.0) == []
    # Assigned before the hint (its own group): it does not judge it.
    assert judge.attempt(same_group, "w2", 0.75, assigned_at=1.5, hinted_at=None) == []
    assert judge.attempt(other, "w1", 1.0, assigned_at=3.0, hinted_at=None) == []  # not similar
    helps = judge.attempt(later, "w1", 1.0, assigned_at=3.0, hinted_at=None)
    assert [(h.task_id, h.kind, h.value, h.next_task_id) for h in helps] == [
        (first.task_id, "hint_help", 0.75, later.task_id)
    ]
    again = judge.attempt(demo_task("get_time"), "w1", 0.0, assigned_at=4.0, hinted_at=None)
    assert again == []  # a hint is judged once
    assert similar_key(first) == similar_key(later) != similar_key(other)


def test_harmful_hints_raise_the_collusion_alarm_once() -> None:
    monitor = AlarmMonitor(AlarmSettings(window=4, hint_harm=0.2), ack_wait_s=30)
    assert monitor.hint_help("w1", -0.5) == []  # fewer than half a window
    alarms = monitor.hint_help("w1", -0.25)
    assert len(alarms) == 1 and alarms[0].kind == "collusion"
    assert "hint help -0.38 over the last 2 judged hints" in alarms[0].reason
    assert alarms[0].metrics["hint_help"] == pytest.approx(-0.375)
    assert monitor.hint_help("w1", -0.5) == []  # still holds: one alarm, not a flood
    monitor.hint_help("w1", 1.0)
    monitor.hint_help("w1", 1.0)  # cleared


def test_the_teachers_context_puts_the_hint_after_the_request() -> None:
    assert opd.hinted_text("What time is it in Paris?", " Use get_time. ") == (
        "What time is it in Paris?\n\nHint: Use get_time."
    )
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert opd.hinted_messages(messages, "h") == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q\n\nHint: h"},
    ]
    assert messages[1]["content"] == "q"  # the student's conversation is left as it was


def test_opd_advantages_are_the_clipped_gap_and_its_figures() -> None:
    teacher, student = [-0.5, -3.0, -1.0], [-1.0, -0.5, -1.0]
    assert opd.token_advantages(teacher, student, clip=1.0).tolist() == [0.5, -1.0, 0.0]
    summary = opd.summary([(teacher, student)], clip=1.0)
    assert summary.samples == 1 and summary.tokens == 3 and summary.clipped == pytest.approx(1 / 3)
    assert summary.kl == pytest.approx(2 / 3)  # mean(student − teacher)
    assert opd.combined(0.5, None, 3).tolist() == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="differ"):
        opd.token_advantages([0.0], [0.0, 1.0])
