"""Every score is informative (issue 23 §4): under what workers actually send, no dimension of any
environment profile is constant, and none decides alone on one trivial feature.

The samples are the demo tasks' answers (the gold tool call, the weaker teacher's wrong tool, a wrong
city), replies of a worker serving the untrained tiny model (captured below, and generated afresh in the
slow test), symbol soup, and, per environment, what a worker there attaches or answers (exit codes and
commands, test counts and diffs, GUI actions)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.agents.events import ResultEvent
from engine.agents.scoring import PROFILES, CombinedScorer, OfflineJudge, PRMScorer, ScoredResult, split_reply
from engine.agents.tasks import TaskSpec, demo_tasks
from engine.demo.task import TEACHER_CONFUSES
from engine.models.corpus import tool_call

SOUP = "<step>%%%</step><answer>!!!</answer>"
# Replies of a worker serving the untrained tiny model (max_new_tokens 48, temperature 1), to the
# demo prompts they answer: byte soup with city and tool names floating in it.
BASE_REPLIES = {
    "What is the weather in Sydney?": (
        " LondonG\ufffdti\x06yo\ufffd webain I"
        "t\ufffd1assis\ufffd\ufffdqu/\ufffdMadridetis"
        'lo\ufffd\ufffd\ufffdWhrainy\ufffd\ufffd"~7\u0442aN@ To'
        "ronto I\x1a8noerlinokTok\x10&"
    ),
    "Can you look up the time in Madrid?": (
        "!\ufffd\x10\ufffd\ufffden\ufffdD lookarchche\x0ene"
        "wsaiolconvertount\ufffdRome\x03 "
        "needamount\ufffdO\ufffd\ufffdholight Ro"
        "me\ufffde\ufffd\r\ufffda\ufffd\ufffdthtimemaiaran\ufffd"
        "JPwsokmaton"
    ),
    "Call the time tool for Madrid.": (
        "15origin andgg\ufffd Bskysnow"
        "y, 2amR\ufffd\x08\ufffd?\ufffdTorontoid\x14\ufffd "
        "from\ufffd\x16\ufffd\x15ver\x7feasnttyan\ufffdto"
        "ol up\ufffd7u"
    ),
    "I need the weather for Sydney.": (
        "s:'\x16\ufffded~Tokyo Dublinjgg\ufffd"
        "on\x11\ufffdciuserno hotels an+i"
        'ma\x1d\x1e\x1dtan\ufffd#\ufffd",feasOs\ufffd@ho '
        'Convertnefindarg"}ation{'
        '"\u047c\u02711'
    ),
    "Can you look up the hotels in Seoul?": (
        "\ufffdSydne\ufffdwyfind fro che305"
        "ton Convert\ufffdQToridubDela"
        'mN\ufffd an\rbVi\x7f\u068d{"tant\x0b\ufffdook\ufffd'
        "snowyS\ufffd(tantK CallJ\x12 2wi"
        "ndtoollig"
    ),
    "Please check the weather in Seoul.": (
        "\ufffdMadrlightverJPargationQ"
        "\ufffdolsnowyuserTok is\ufffd\ufffdoulS"
        "ydnewindcityTorontoeas\ufffd\ufffd"
        "ub\ufffd Per\ufffdht\r frows?\x01Ona\ufffd\x12"
        "\ufffdmailciZmah\x12light Berlin"
    ),
}


def demo_samples() -> Iterator[tuple[TaskSpec, str, str]]:
    """(task, what the reply is, the reply) for the demo prompts above."""
    specs = {spec.prompt: spec for spec in demo_tasks()}
    for prompt, base in BASE_REPLIES.items():
        spec = specs[prompt]
        tool, city = spec.metadata["answer_tool"], spec.metadata["answer_city"]
        other_tool = TEACHER_CONFUSES.get(tool, "get_news" if tool != "get_news" else "get_time")
        yield spec, "right", tool_call(tool, city=city)
        yield spec, "wrong", tool_call(other_tool, city=city)  # the weaker teacher's mistake
        yield spec, "wrong", tool_call(tool, city="Lima" if city != "Lima" else "Oslo")
        yield spec, "no answer", base
        yield spec, "no answer", SOUP


async def scored(
    spec: TaskSpec, reply: str, environment: str, metadata: dict[str, Any] | None = None
) -> ScoredResult:
    task = spec.event("manager").model_copy(update={"environment": environment})
    steps, answer = split_reply(reply)
    result = ResultEvent(
        task_id=task.task_id,
        worker_id="w1",
        task_type=task.task_type,
        environment=environment,
        status="success",
        result=reply,
        steps=steps,
        answer=answer,
        metadata=metadata or {},
    )
    return await CombinedScorer(PRMScorer(OfflineJudge())).score(task, result, None)


def environment_samples(environment: str) -> list[tuple[TaskSpec, str, dict[str, Any]]]:
    """What a worker in `environment` sends besides text: the terminal's exit codes and commands, the
    code environment's test counts and diffs, a GUI agent's actions."""
    terminal = TaskSpec("List the files, then build the project.", "shell", "terminal")
    swe = TaskSpec("Fix the failing test in parser.py.", "code", "swe")
    gui = TaskSpec("Open the settings and turn on dark mode.", "gui", "gui")
    diff = "--- a/parser.py\n+++ b/parser.py\n-    return None\n+    return tokens\n"
    return {
        "chat": [],
        "terminal": [
            (terminal, "<step>ls</step><step>make</step><answer>built</answer>", {"exit_codes": [0, 0]}),
            (terminal, "<step>ls</step><step>make</step><answer>failed</answer>", {"exit_codes": [0, 2]}),
            (terminal, "<step>make</step><answer>no</answer>", {"exit_code": 127}),
            (terminal, "<step>ls</step><answer>built</answer>", {"exit_codes": [0] * 12, "commands": 12}),
        ],
        "swe": [
            (
                swe,
                "<step>Return the tokens.</step><answer>fixed</answer>",
                {"tests_passed": 9, "tests_total": 9, "diff": diff},
            ),
            (
                swe,
                "<step>Skip the test.</step><answer>done</answer>",
                {"tests_passed": 3, "tests_total": 9, "diff_lines": 600},
            ),
        ],
        "gui": [
            (
                gui,
                "<step>I open the menu.\nclick(12, 30)</step><step>click(40, 88)</step><answer>done</answer>",
                {"commands": 2},
            ),
            (gui, '<step>key("ctrl+,")</step><answer>done</answer>', {"commands": 1}),
            (
                gui,
                "<step>click(-4, 2)</step><step>press the toggle</step><answer>done</answer>",
                {"commands": 20},
            ),
        ],
    }[environment]


@pytest.mark.parametrize("environment", sorted(PROFILES))
async def test_a_right_answer_outscores_a_wrong_one_which_outscores_no_answer(environment: str) -> None:
    """The demo's answers in every environment, as a worker sends them (no exit codes, no tests): the
    outcome ranks them, so no single trivial feature (the step count, the length) decides it."""
    outcomes: dict[str, list[float]] = {"right": [], "wrong": [], "no answer": []}
    for spec, kind, reply in demo_samples():
        result = await scored(spec, reply, environment)
        outcomes[kind].append(result.outcome_score)
        if environment == "terminal":  # no exit code: efficiency alone would decide, so the text does
            assert (
                result.profile == "chat"
                and "terminal: no dimension had evidence: scored with the chat profile" in (result.notes)
            )
        assert set(result.dimensions) <= set(PROFILES[result.profile])
    assert min(outcomes["right"]) > max(outcomes["wrong"]), outcomes
    assert min(outcomes["wrong"]) > max(outcomes["no answer"]), outcomes
    assert min(outcomes["right"]) - max(outcomes["no answer"]) > 0.25, outcomes  # not a hair's breadth


@pytest.mark.parametrize("environment", sorted(PROFILES))
async def test_no_dimension_is_constant_under_what_workers_send(environment: str) -> None:
    values: dict[str, list[float]] = {}
    for spec, _, reply in demo_samples():
        for name, value in (await scored(spec, reply, environment)).dimensions.items():
            values.setdefault(name, []).append(value)
    for spec, reply, metadata in environment_samples(environment):
        for name, value in (await scored(spec, reply, environment, metadata)).dimensions.items():
            values.setdefault(name, []).append(value)
    assert set(values) == set(PROFILES[environment]) | (
        {"prm", "halugate", "length"} if environment == "terminal" else set()
    )
    for name, seen in values.items():
        assert max(seen) - min(seen) >= 0.25, (name, seen)
        assert statistics.pstdev(seen) > 0.05, (name, seen)


@pytest.mark.slow
async def test_the_tiny_models_own_replies_score_below_the_right_answers(tiny_model: Path) -> None:
    """Replies generated now by the untrained tiny model, as a model worker serves it."""
    from engine.agents.backends import SYSTEM_PROMPT
    from engine.agents.plane_settings import AgentsSettings
    from engine.agents.policy import LocalPolicy

    settings = AgentsSettings()
    policy = LocalPolicy.load(str(tiny_model), tiny_model.parent, seed=0)
    specs = demo_tasks()[:4]
    for environment in sorted(PROFILES):
        for spec in specs:
            reply = policy.generate(
                spec.prompt,
                system=SYSTEM_PROMPT,
                max_new_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                seed=None,
            ).text
            base = await scored(spec, reply, environment)
            right = await scored(spec, spec.reference or "", environment)
            assert base.outcome_score < right.outcome_score - 0.3, (environment, reply)
            assert base.dimensions.get("halugate", 0.0) < right.dimensions.get("halugate", 1.0)
