"""Step scoring of the agents plane (docs/reference/agents-plane.md §5-6, rules 3-4): replies, the offline
judge's heuristic, the real judges over HTTP (OpenAI-compatible: tests/openai_server.py; Claude:
tests/messages_server.py through the anthropic SDK), PRM votes and clamping, every dimension of every
environment profile, the reward, and the manager's feedback (offline and Claude)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from messages_server import MessagesServer, Reply
from openai_server import OpenAIServer

from engine.agents.events import ResultEvent, TaskEvent
from engine.agents.feedback import ClaudeFeedback, OfflineFeedback, parse_feedback
from engine.agents.scoring import (
    CONTRADICTED,
    IRRELEVANT,
    SUPPORTED,
    UNSUPPORTED,
    ClaudeJudge,
    CombinedScorer,
    Evidence,
    LengthBand,
    OfflineJudge,
    OpenAIJudge,
    PRMScorer,
    Source,
    arithmetic,
    changed_lines,
    checked_numbers,
    claim_verdict,
    combine,
    equations,
    halugate_score,
    judge_prompt,
    parse_action,
    parse_json_object,
    render_reply,
    reward_of,
    split_reply,
    vote_of,
)

KEY = "sk-ant-test-key-0123456789abcdef"
WEATHER = "Call the weather tool for Paris."
PARIS_CALL = '{"tool": "get_weather", "args": {"city": "Paris"}}'
LONDON_CALL = '{"tool": "get_weather", "args": {"city": "London"}}'
SYDNEY_CALL = '{"tool": "get_weather", "args": {"city": "Sydney"}}'
# What a worker serving the untrained tiny model answers (a reply captured from one, to "What is the
# weather in Sydney?"): bytes that do not decode, and city names floating in them.
BASE_REPLY = (
    " LondonG\ufffdti\u0006yo\ufffd webain It\ufffd1assis\ufffd\ufffdqu/\ufffdMadridetislo"
    "\ufffd\ufffd\ufffdWhrainy"
    '\ufffd\ufffd"~7\u0442aN@ Toronto I\u001a8noerlinokTok\u0010&'
)
NATS_SECRET = "nats://s3cr3tTOKENvalue1234@host:4222"
ANTHROPIC_SECRET = "sk-ant-api03-SECRETsecretSECRET0123456789"


def judged(progress: object, correctness: object) -> str:
    return json.dumps({"progress": progress, "correctness": correctness, "reasoning": "scripted"})


def task_event(prompt: str = WEATHER, environment: str = "chat", **fields: Any) -> TaskEvent:
    return TaskEvent(manager_id="m1", task_type="demo", environment=environment, prompt=prompt, **fields)


def result_event(task: TaskEvent, steps: list[str], answer: str, **fields: Any) -> ResultEvent:
    fields.setdefault("status", "success")
    fields.setdefault("environment", task.environment)
    return ResultEvent(
        task_id=task.task_id,
        worker_id="w1",
        task_type=task.task_type,
        prompt=task.prompt,
        result=render_reply(steps, answer),
        steps=steps,
        answer=answer,
        **fields,
    )


@pytest.fixture
def openai() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


@pytest.fixture
async def judge(openai: OpenAIServer) -> AsyncIterator[OpenAIJudge]:
    judge = OpenAIJudge(openai.base_url, openai.model, api_key="local-key", timeout=5)
    yield judge
    await judge.aclose()


def offline_scorer() -> CombinedScorer:
    return CombinedScorer(PRMScorer(OfflineJudge()))


# ============================================================================================ replies


def test_split_reply_reads_steps_and_the_answer() -> None:
    assert split_reply("<step> a </step>\n<step>b\nc</step>\n<answer> 42 </answer>") == (["a", "b\nc"], "42")
    assert split_reply("<step>a</step><step>b") == (["a", "b"], "<step>a</step><step>b")
    assert split_reply("<step>a<step>b<answer>x") == (["a", "b"], "x")  # open steps end at the next tag
    assert split_reply("<step>think<answer>done</answer>") == (["think"], "done")
    assert split_reply("first line\n\n second line \n<answer>7</answer>") == (
        ["first line", "second line"],
        "7",
    )
    assert split_reply("  just this  ") == (["just this"], "just this")
    assert split_reply("<answer>only</answer>") == ([], "only")
    assert split_reply("") == ([], "")


def test_render_reply_is_the_canonical_text() -> None:
    assert render_reply(["a", "b"], "c") == "<step>a</step>\n<step>b</step>\n<answer>c</answer>"
    assert render_reply([], "c") == "<answer>c</answer>"


_plain = st.text(st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), max_size=30).map(
    str.strip
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(_plain, max_size=5), _plain)
def test_render_then_split_gives_back_steps_and_answer(steps: list[str], answer: str) -> None:
    assert split_reply(render_reply(steps, answer)) == (steps, answer)


def test_split_then_render_is_stable() -> None:
    text = "<step>one</step> noise <step>two\n<answer>three"
    steps, answer = split_reply(text)
    assert split_reply(render_reply(steps, answer)) == (steps, answer) == (["one", "two"], "three")


# ====================================================================================== offline judge


async def offline(task: str, steps: list[str], index: int = -1) -> dict[str, Any]:
    return await OfflineJudge().judge(task, steps, index % len(steps))


async def test_offline_judge_ranks_a_grounded_tool_call_above_a_wrong_city() -> None:
    good, bad = await offline(WEATHER, [PARIS_CALL]), await offline(WEATHER, [LONDON_CALL])
    assert good["progress"] > bad["progress"] and good["correctness"] > bad["correctness"]
    assert vote_of(good) > vote_of(bad)
    assert "london" in bad["reasoning"]


@pytest.mark.parametrize(
    ("bad_step", "why"),
    [
        ("weather weather weather weather weather weather weather weather", "repetitive"),
        ("#$%^ &*!! ~~ ^^^", "no words"),
        ('{"tool": "get_weather", "args": {"city": "Paris"', "unbalanced"),
        ("The weather in Tokyo is 31 degrees.", "ungrounded"),
        ("", "no words"),
    ],
)
async def test_offline_judge_penalises_unsound_steps(bad_step: str, why: str) -> None:
    good = await offline(WEATHER, ["I will call the weather tool for Paris."])
    bad = await offline(WEATHER, [bad_step])
    assert bad["correctness"] < good["correctness"] == 1.0
    assert why in bad["reasoning"]


async def test_offline_judge_checks_arithmetic_and_rewards_progress_over_steps() -> None:
    task = "Tom has 12 apples and buys 30 more. How many apples does Tom have?"
    right = await offline(task, ["Tom starts with 12 apples.", "12 + 30 = 42, so Tom has 42 apples."])
    wrong = await offline(task, ["Tom starts with 12 apples.", "12 + 30 = 52, so Tom has 52 apples."])
    assert (
        right["correctness"] == 1.0 and wrong["correctness"] < 0.5 and "wrong equation" in wrong["reasoning"]
    )
    first = await offline(task, ["Tom starts with 12 apples.", "12 + 30 = 42"], 0)
    assert right["progress"] > first["progress"] > 0  # steps 1..i cover more of the task as i grows


async def test_offline_judge_is_deterministic_and_not_constant() -> None:
    steps = ["Look up the weather.", PARIS_CALL]
    assert await offline(WEATHER, steps) == await offline(WEATHER, steps)
    votes = {vote_of(await offline(WEATHER, [s])) for s in (PARIS_CALL, LONDON_CALL, "ok", "Paris weather")}
    assert len(votes) == 4 and all(0.0 <= v <= 1.0 for v in votes)


_messy = st.text(st.sampled_from(list("abcXYZ 0123456789.,;:=+-*/()[]{}\"'\n<>_")), max_size=80)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(_messy, st.lists(_messy, min_size=1, max_size=3))
async def test_every_heuristic_stays_in_range_on_any_text(task: str, steps: list[str]) -> None:
    reply = await OfflineJudge().judge(task, steps, len(steps) - 1)
    assert 0.0 <= reply["progress"] <= 1.0 and 0.0 <= reply["correctness"] <= 1.0
    assert 0.0 <= halugate_score(steps[-1], Source.of(task)) <= 1.0
    feedback = OfflineFeedback().assess(task, steps, steps[-1])
    assert 0.0 <= feedback.score <= 1.0 and feedback.text
    split_reply(task + "".join(steps))
    parse_action(steps[-1])


def test_huge_arithmetic_is_not_judged() -> None:
    assert (
        OfflineJudge.grounding("x", ["9" * 5000 + " * 2 = 1", " + ".join(["1"] * 3000) + " = 3000"], 1)[2]
        == 0
    )


def test_the_judge_prompt_shows_steps_up_to_i_only() -> None:
    prompt = judge_prompt("Sum 2 and 3.", ["alpha step", "beta step", "gamma step"], 1)
    assert "Task:\nSum 2 and 3." in prompt and "1. alpha step\n2. beta step" in prompt
    assert "Step under judgement (step 2):\nbeta step" in prompt and "gamma" not in prompt
    assert '"progress"' in prompt and '"correctness"' in prompt


def test_judge_replies_parse_with_fences_and_preambles() -> None:
    assert parse_json_object('```json\n{"progress": 1}\n```') == {"progress": 1}
    assert parse_json_object('Here you go: {"progress": 0.5} hope it helps') == {"progress": 0.5}
    for bad in ("no json here", "[1, 2]"):
        with pytest.raises(ValueError):
            parse_json_object(bad)


def test_a_vote_clamps_and_counts_missing_or_odd_values_as_half() -> None:
    assert vote_of({"progress": 3, "correctness": 3}) == 1.0
    assert vote_of({"progress": -2, "correctness": 1}) == 0.5
    assert vote_of({"progress": 1}) == 0.75
    assert vote_of({"progress": float("nan"), "correctness": "high"}) == 0.5
    assert vote_of({"progress": True, "correctness": None}) == 0.5


# ====================================================================================== remote judges


async def test_openai_judge_sends_one_json_mode_message(openai: OpenAIServer, judge: OpenAIJudge) -> None:
    openai.reply(judged(0.8, 0.6))
    reply = await judge.judge(WEATHER, ["first", "second", "third"], 1)
    assert reply == {"progress": 0.8, "correctness": 0.6, "reasoning": "scripted"}
    request = openai.requests[-1]
    assert request.path == "/v1/chat/completions" and request.headers["authorization"] == "Bearer local-key"
    body = request.json
    assert body["model"] == "test-model" and body["response_format"] == {"type": "json_object"}
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert body["messages"][0]["content"] == judge_prompt(WEATHER, ["first", "second", "third"], 1)


async def test_a_judge_replying_3_and_3_scores_1(openai: OpenAIServer, judge: OpenAIJudge) -> None:
    openai.reply(judged(3, 3), judged(-1, 0.4))
    assert await PRMScorer(judge).score(WEATHER, ["a", "b"]) == [1.0, 0.2]


async def test_a_reply_that_is_not_json_votes_half(openai: OpenAIServer, judge: OpenAIJudge) -> None:
    openai.reply("I think it is fine.")
    assert await PRMScorer(judge).score(WEATHER, ["a"]) == [0.5]


async def test_a_server_error_is_left_out_of_the_vote(openai: OpenAIServer, judge: OpenAIJudge) -> None:
    openai.reply(judged(1, 1), "not json").error(500)
    scores = await PRMScorer(judge, votes=3).score_steps(WEATHER, ["a"])
    assert scores.scores == (0.75,)  # median of 1.0 and 0.5; the 500 is not a vote
    assert scores.calls == 3 and len(scores.failures) == 1 and "500" in scores.failures[0]


async def test_no_valid_vote_gives_half(openai: OpenAIServer, judge: OpenAIJudge) -> None:
    openai.error(500).error(503)
    scores = await PRMScorer(judge, votes=2).score_steps(WEATHER, ["a"])
    assert scores.scores == (0.5,) and len(scores.failures) == 2


async def test_votes_take_the_median(openai: OpenAIServer, judge: OpenAIJudge) -> None:
    openai.reply(judged(0.2, 0.2), judged(0.9, 0.9), judged(0.6, 0.6))
    assert await PRMScorer(judge, votes=3).score(WEATHER, ["a"]) == [pytest.approx(0.6)]
    openai.reply(judged(0.2, 0.2), judged(0.4, 0.4), judged(0.8, 0.8), judged(1, 1))
    assert await PRMScorer(judge, votes=4).score(WEATHER, ["a"]) == [pytest.approx(0.6)]  # mean of middle two


async def test_steps_are_scored_one_after_another(openai: OpenAIServer, judge: OpenAIJudge) -> None:
    openai.responder = lambda request: judged(0.5, 1.0)
    assert await PRMScorer(judge, votes=2).score(WEATHER, ["alpha", "beta", "gamma"]) == [0.75] * 3
    judged_steps = [r.json["messages"][0]["content"].split("(step ")[1][0] for r in openai.requests]
    assert judged_steps == ["1", "1", "2", "2", "3", "3"]
    first_call = openai.requests[0].json["messages"][0]["content"]
    assert "alpha" in first_call and "beta" not in first_call and "gamma" not in first_call


async def test_claude_judge_reads_a_fenced_json_reply(server: MessagesServer) -> None:
    judge = ClaudeJudge(KEY, "claude-test", base_url=server.base_url, max_retries=0)
    try:
        server.text(["```json\n", judged(0.9, 0.7), "\n```"])
        server.error(529)
        assert await PRMScorer(judge).score(WEATHER, ["a", "b"]) == [pytest.approx(0.8), 0.5]
    finally:
        await judge.aclose()
    body = server.requests[0].json
    assert body["model"] == "claude-test" and body["messages"][0]["content"] == judge_prompt(
        WEATHER, ["a"], 0
    )
    assert server.requests[0].api_key == KEY


async def test_secrets_never_reach_a_remote_judge_or_reviewer(
    server: MessagesServer, openai: OpenAIServer, judge: OpenAIJudge
) -> None:
    task = f"Connect to {NATS_SECRET} with key {ANTHROPIC_SECRET} and report the weather in Paris."
    steps = [f"Use {NATS_SECRET}.", f"export ANTHROPIC_API_KEY={ANTHROPIC_SECRET}"]
    openai.responder = lambda request: judged(1, 1)
    server.responder = lambda request: Reply.text([judged(1, 1)])
    claude = ClaudeJudge(KEY, "claude-test", base_url=server.base_url, max_retries=0)
    reviewer = ClaudeFeedback(KEY, "claude-test", base_url=server.base_url, max_retries=0)
    try:
        await PRMScorer(judge).score(task, steps)
        await PRMScorer(claude).score(task, steps)
        await reviewer.assess(task, steps, f"Done via {NATS_SECRET} ({ANTHROPIC_SECRET})")
    finally:
        await claude.aclose()
        await reviewer.aclose()
    sent = [json.dumps(r.json) for r in openai.requests] + [r.raw.decode() for r in server.requests]
    assert len(sent) == 2 + 2 + 1
    for text in sent:
        assert "s3cr3tTOKENvalue1234" not in text and "SECRETsecretSECRET" not in text
        assert "[REDACTED" in text and "host:4222" in text  # the rest of the message still arrives


# ========================================================================================= dimensions


def test_halugate_verdicts_against_the_prompt_only() -> None:
    source = Source.of("Alice has 3 apples and Bob has 5 pears. The shop is open on Sunday.")
    assert claim_verdict("Alice has 3 apples", source) == SUPPORTED == 1.0
    assert claim_verdict("Alice has 4 apples", source) == CONTRADICTED == 0.25  # a number that conflicts
    assert claim_verdict("Carol has 3 apples", source) == CONTRADICTED  # a name that conflicts
    assert claim_verdict("The shop is not open on Sunday", source) == CONTRADICTED  # a negation
    assert claim_verdict("3 + 5 = 9", source) == CONTRADICTED  # wrong arithmetic
    assert claim_verdict("The weather will be sunny tomorrow", source) == IRRELEVANT == 0.0  # another topic
    assert claim_verdict("Alice has a basket of apples", source) == SUPPORTED  # its words are the source's
    assert claim_verdict("Alice has 7 apples, and Bob is her brother", source) == CONTRADICTED
    assert halugate_score("Alice has 3 apples. Alice has 4 apples.", source) == (1.0 + 0.25) / 2
    # A claim about something else beside one on the task counts as unsupported; alone, as nothing.
    assert halugate_score("Alice has 3 apples. The weather will be sunny tomorrow.", source) == 0.75
    assert halugate_score("The weather will be sunny tomorrow.", source) == 0.0
    assert halugate_score("Let me think.", source) == 0.0  # no claims: nothing bears on the task
    with_reference = Source.of("Which city hosts the tower?", "Paris")
    assert claim_verdict("The tower is in Paris", with_reference) == SUPPORTED
    assert claim_verdict("The tower is in Paris", Source.of("Which city hosts the tower?")) == UNSUPPORTED
    assert claim_verdict("The tower is in Rome", with_reference) == CONTRADICTED  # not the reference's city


def test_arithmetic_reads_x_times_and_words_as_operators() -> None:
    for prompt in (
        "What is 6 x 7?",
        "What is 6 × 7?",
        "What is 6*7?",
        "What is 6 times 7?",
        "6 multiplied by 7",
    ):
        assert arithmetic(prompt) == {"42"}, prompt
    assert arithmetic("What is 15 divided by 3.") == {"5"} and arithmetic("10 minus 4, then") == {"6"}
    assert arithmetic("12 + 30 - 2") == {"40"}
    # Dates, ranges, hex and equations already stated are not sums to work out.
    for text in ("on 2024-01-05", "3-4 days", "0x1F", "Is 6 x 7 = 42?", "version 1.2"):
        assert arithmetic(text) == set(), text
    assert equations("6 x 7 = 42, 6x7=41, 6 × 7 = 42, 6*7 = 42") == ({"42"}, 1)
    assert checked_numbers("30 + 12 = 42 and 5 x 5 = 26") == {"12", "30", "42"}


# The reference set of the hallucination check: (prompt, reference, right, wrong, irrelevant). Each right
# answer must score above its wrong one, and that above the irrelevant one.
REFERENCE_SET = [
    ("What is 6 x 7?", "42", "The answer is 42.", "The answer is 41.", "banana"),
    ("What is 6 × 7?", "42", "6 × 7 = 42", "6 × 7 = 48", "I like turtles."),
    ("What is 6 * 7?", "42", "42", "41", "The weather is nice today in the park."),
    ("What is 6 x 7?", None, "The answer is 42", "The answer is 41", "banana"),  # the prompt's own sum
    ("What is 6 times 7?", "42", "Six times seven is forty-two.", "It is 48.", "Cats are mammals."),
    ("What is 12 + 30?", "42", "12 + 30 = 42", "12 + 30 = 52", "Cats are mammals."),
    (
        "What is 100 divided by 4?",
        "25",
        "100 divided by 4 is 25.",
        "It is 20.",
        "I enjoy hiking in the hills.",
    ),
    (
        "What is 9 minus 3?",
        "6",
        "9 - 3 = 6, so the answer is 6.",
        "The answer is 5.",
        "purple monkey dishwasher",
    ),
    ("What is 7 x 8? Show your work.", "56", "7 x 8 = 56", "7 x 8 = 54", "Let me think about it."),
    (
        "What is the capital of France?",
        "Paris",
        "The capital of France is Paris.",
        "The capital of France is Lyon.",
        "I had pasta for dinner yesterday.",
    ),
    (
        "Who wrote Hamlet?",
        "William Shakespeare",
        "Hamlet was written by William Shakespeare.",
        "Hamlet was written by Charles Dickens.",
        "The ocean is deep and wide.",
    ),
    (
        "Which planet is known as the Red Planet?",
        "Mars",
        "Mars is known as the Red Planet.",
        "Venus is known as the Red Planet.",
        "I need to buy some milk and bread.",
    ),
    (
        "How many legs does a spider have?",
        "8",
        "A spider has 8 legs.",
        "A spider has 6 legs.",
        "Stocks fell sharply.",
    ),
    (
        "In which year did Apollo 11 land on the Moon?",
        "1969",
        "Apollo 11 landed on the Moon in 1969.",
        "Apollo 11 landed on the Moon in 1972.",
        "My favourite colour is green.",
    ),
    (
        "What colour is a clear daytime sky?",
        "blue",
        "A clear daytime sky is blue.",
        "It is green.",
        "Trains run late.",
    ),
    (
        "What gas do plants absorb from the air?",
        "carbon dioxide",
        "Plants absorb carbon dioxide.",
        "Plants absorb oxygen.",
        "My car needs new tyres.",
    ),
    (
        "Which tool tells the time in Madrid?",
        "get_time",
        "Use get_time for Madrid.",
        "Use get_weather.",
        "banana bread",
    ),
    (
        "What is the weather in Sydney?",
        SYDNEY_CALL,
        SYDNEY_CALL,
        SYDNEY_CALL.replace("get_weather", "get_news"),
        BASE_REPLY,
    ),
    (WEATHER, PARIS_CALL, PARIS_CALL, LONDON_CALL, "<step>%%%</step><answer>!!!</answer>"),
]


@pytest.mark.parametrize(("prompt", "reference", "right", "wrong", "irrelevant"), REFERENCE_SET)
def test_the_hallucination_check_ranks_right_above_wrong_above_irrelevant(
    prompt: str, reference: str | None, right: str, wrong: str, irrelevant: str
) -> None:
    source = Source.of(prompt, reference)
    scores = [
        halugate_score(split_reply(reply)[0] + [split_reply(reply)[1]], source)
        for reply in (right, wrong, irrelevant)
    ]
    assert scores[0] > scores[1] > scores[2], scores


def test_the_six_times_seven_case_of_the_issue() -> None:
    """ "banana" scored 0.8 while "The answer is 42" and "The answer is 41" both scored 0.5."""
    for times in ("x", "×", "*"):
        source = Source.of(f"What is 6 {times} 7?", "42")
        right, wrong, banana = (
            halugate_score(r, source) for r in ("The answer is 42", "The answer is 41", "banana")
        )
        assert (right, wrong, banana) == (1.0, 0.25, 0.0), times


def test_length_band() -> None:
    band = LengthBand(min_words=2, max_words=4)
    assert [band.score(t) for t in ("", "one", "one two", "a b c d", "a b c d e f g h")] == [
        0,
        0.5,
        1,
        1,
        0.5,
    ]
    with pytest.raises(ValueError):
        LengthBand(min_words=5, max_words=2)


def test_gui_action_grammar() -> None:
    valid = [
        "click(10, 20)",
        "double_click(0,0)",
        'type("hello, world")',
        "key('enter')",
        "scroll(0, -3)",
        "drag(1, 2, 30.5, 40)",
        "wait(1.5)",
        'I will press enter.\nkey("enter")',
        "`click(5, 5)`;",
    ]
    invalid = [
        "click(-1, 2)",
        "click(1)",
        "type(hello)",
        'key("")',
        "wait(-1)",
        "jump(1, 2)",
        "click(1, 2) and then more",
        "press enter",
    ]
    assert all(parse_action(a) is not None for a in valid), [a for a in valid if parse_action(a) is None]
    assert all(parse_action(a) is None for a in invalid), [a for a in invalid if parse_action(a) is not None]
    assert parse_action('type("hi")').args == ("hi",) and parse_action("drag(1,2,3,4)").args == (1, 2, 3, 4)


def test_changed_lines_skip_the_headers() -> None:
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-old\n+new\n context\n+added\n"
    assert changed_lines(diff) == 3


def evidence(
    steps: list[str],
    metadata: dict[str, Any] | None = None,
    scores: list[float] | None = None,
    answer: str = "done",
) -> Evidence:
    prm = tuple(scores if scores is not None else [1.0] * len(steps))
    return Evidence(WEATHER, None, tuple(steps), answer, prm, metadata or {})


def test_terminal_combines_success_and_efficiency() -> None:
    combined = combine("terminal", evidence(["ls", "cat x"], {"exit_codes": [0, 1]}))
    assert combined.units == [pytest.approx(1.0), pytest.approx(0.2)] and combined.dimensions == {
        "success": 0.5,
        "efficiency": 1.0,
    }
    assert combined.profile == "terminal" and combined.notes == []
    over_budget = evidence(["a"] * 4, {"exit_code": 0, "step_budget": 2})
    assert combine("terminal", over_budget).dimensions == {"success": 1.0, "efficiency": 0.5}
    commands = evidence(
        ["a"], {"exit_codes": [0, 0, 1, 0], "commands": ["a", "b", "c", "d"], "step_budget": 2}
    )
    assert combine("terminal", commands).dimensions == {"success": 0.75, "efficiency": 0.5}


def test_a_dimension_without_evidence_is_left_out_and_cost_alone_decides_nothing() -> None:
    # Commands but no exit codes: efficiency alone would decide, so the reply's text does (chat profile).
    combined = combine("terminal", evidence(["ls"], {"commands": ["ls"]}))
    assert combined.profile == "chat" and set(combined.dimensions) == {"prm", "halugate", "length"}
    assert combined.notes == [
        "success: no data (metadata exit_code or exit_codes)",
        "terminal: only efficiency had evidence: scored with the chat profile",
    ]
    nothing = combine("terminal", evidence(["ls"], {}))  # what workers send: no exit codes, no commands
    assert (
        nothing.profile == "chat"
        and "terminal: no dimension had evidence: scored with the chat profile" in (nothing.notes)
    )
    # A reply's own step count is no evidence of what ran: efficiency needs the environment's record.
    assert "efficiency" not in combine("gui", evidence(["click(1, 2)"], {})).dimensions
    # swe without tests or a diff: the PRM alone, renormalised (it is no cost).
    swe = combine("swe", evidence(["edit"], {}, scores=[0.4]))
    assert swe.profile == "swe" and swe.dimensions == {"prm": 0.4} and swe.units == [pytest.approx(0.4)]


async def test_symbol_soup_no_longer_scores_1_in_the_terminal() -> None:
    """Without exit codes, efficiency alone decided, and `<step>%%%</step><answer>!!!</answer>` scored 1.0."""
    task = task_event(environment="terminal")
    soup = "<step>%%%</step><answer>!!!</answer>"
    steps, answer = split_reply(soup)
    scored = await offline_scorer().score(task, result_event(task, steps, answer), None)
    assert scored.profile == "chat" and scored.outcome_score == 0.0 and scored.reward == 0.0
    good = await offline_scorer().score(
        task, result_event(task, ["I call the weather tool."], PARIS_CALL), None
    )
    assert good.outcome_score > 0.8


def test_a_dimension_that_raises_is_left_out() -> None:
    combined = combine("swe", evidence(["fix"], {"tests_passed": 3, "tests_total": "many"}))
    assert set(combined.dimensions) == {"prm"} and combined.units == [1.0]
    assert any(n.startswith("tests failed: metadata.tests_total") for n in combined.notes)


def test_swe_and_gui_profiles() -> None:
    diff = "--- a/f\n+++ b/f\n" + "+x\n" * 100
    swe = combine(
        "swe", evidence(["edit"], {"tests_passed": 3, "tests_total": 4, "diff": diff}, scores=[0.5])
    )
    assert swe.dimensions == {"tests": 0.75, "prm": 0.5, "diff_size": pytest.approx(1 / 1.5)}
    assert swe.units == [pytest.approx(0.5 * 0.75 + 0.3 * 0.5 + 0.2 / 1.5)]
    steps = ["click(1, 2)", "I look at the screen", 'type("x")', "wait(1)"]
    gui = combine("gui", evidence(steps, {"commands": 4, "step_budget": 2}, scores=[1.0, 0.0, 1.0, 1.0]))
    assert gui.dimensions == {"prm": 0.75, "action_validity": 0.75, "efficiency": 0.5}


async def test_chat_results_with_offline_prm() -> None:
    task = task_event()
    good = await offline_scorer().score(
        task, result_event(task, ["I call the weather tool.", PARIS_CALL], PARIS_CALL), None
    )
    bad = await offline_scorer().score(task, result_event(task, [LONDON_CALL], LONDON_CALL), None)
    assert good.profile == "chat" and set(good.dimensions) == {"prm", "halugate", "length"}
    assert len(good.step_scores) == 2 and good.prm_score == pytest.approx(sum(good.step_scores) / 2)
    assert good.outcome_score > bad.outcome_score and good.reward == good.outcome_score
    expected = sum(w * good.dimensions[d] for d, w in {"prm": 0.6, "halugate": 0.3, "length": 0.1}.items())
    assert good.outcome_score == pytest.approx(expected)


async def test_the_profile_comes_from_the_result_environment() -> None:
    task = task_event(environment="gui")
    result = result_event(task, ["click(3, 4)"], "clicked", metadata={"environment": "terminal"})
    scored = await offline_scorer().score(task, result, None)
    assert scored.profile == "gui" and "action_validity" in scored.dimensions
    unknown = await offline_scorer().score(
        task, result_event(task, ["x y z"], "x", environment="robotics"), None
    )
    assert unknown.profile == "chat"
    assert "environment 'robotics' has no profile: scored with the chat profile" in unknown.notes


async def test_a_judge_saying_3_and_3_gives_clamped_scores(openai: OpenAIServer, judge: OpenAIJudge) -> None:
    openai.responder = lambda request: judged(3, 3)
    task = task_event()
    scored = await CombinedScorer(PRMScorer(judge)).score(task, result_event(task, ["a b", "c d"], "e"), 1.0)
    assert scored.step_scores == [1.0, 1.0] and scored.prm_score == 1.0
    assert 0.0 <= scored.outcome_score <= 1.0 and scored.verifier_score == 1.0
    assert scored.reward == pytest.approx((scored.outcome_score + 1.0) / 2)


async def test_terminal_metadata_is_read_from_task_and_result() -> None:
    task = task_event(environment="terminal", metadata={"step_budget": 1})
    result = result_event(task, ["ls", "make"], "built", metadata={"exit_codes": [0, 0]})
    scored = await offline_scorer().score(task, result, None)
    assert scored.dimensions == {"success": 1.0, "efficiency": 0.5} and scored.outcome_score == pytest.approx(
        0.9
    )


async def test_failed_and_empty_results() -> None:
    task = task_event(verifier="demo")
    failed = result_event(task, ["a"], "", status="failed", error="model crashed")
    scored = await offline_scorer().score(task, failed, 0.0)
    assert (scored.step_scores, scored.prm_score, scored.outcome_score, scored.reward) == ([], 0.0, 0.0, 0.0)
    assert "failed result: scored 0" in scored.notes
    no_steps = await offline_scorer().score(task, result_event(task, [], PARIS_CALL), None)
    assert no_steps.step_scores == [] and no_steps.prm_score == 0.0 and no_steps.dimensions["prm"] == 0.0
    assert 0.0 < no_steps.outcome_score < 0.5  # halugate and length credit the answer; the PRM gives none
    empty = await offline_scorer().score(task, result_event(task, [], ""), None)
    assert empty.outcome_score == 0.0 and empty.reward == 0.0


def test_reward_of() -> None:
    assert reward_of(0.6, None) == 0.6
    assert reward_of(0.6, 1.0) == pytest.approx(0.8)
    assert reward_of(1.7, None) == 1.0 and reward_of(-0.2, 0.0) == 0.0


# =========================================================================================== feedback


def test_offline_feedback_reads_the_answer() -> None:
    review = OfflineFeedback()
    good = review.assess(WEATHER, ["I call the weather tool."], PARIS_CALL)
    wrong_city = review.assess(WEATHER, [], LONDON_CALL)
    rambling = review.assess(WEATHER, [], "paris " * 200)
    broken = review.assess(WEATHER, [""], '{"tool": "get_weather", "args": {"city": "Paris"')
    assert good.source == "offline" and good.score > max(wrong_city.score, rambling.score, broken.score)
    assert good.score == pytest.approx(sum(good.dimensions.values()) / 3)
    assert wrong_city.text.startswith("Weakest is correctness") and "contradicts" in wrong_city.text
    assert rambling.dimensions["quality"] < good.dimensions["quality"]
    assert review.quality([], "paris " * 200)[1] == "it is too long (200 words)"
    assert broken.text.startswith("Weakest is quality") and "JSON that does not parse" in broken.text
    assert review.assess(WEATHER, [], "").score == 0.0


async def test_offline_feedback_of_a_failed_result() -> None:
    task = task_event()
    feedback = await OfflineFeedback().feedback(
        task, result_event(task, [], "", status="failed", error="CUDA out of memory")
    )
    assert feedback.score == 0.0 and feedback.text == "The task failed: CUDA out of memory."


async def test_claude_feedback_is_parsed_and_clamped(server: MessagesServer) -> None:
    reply = {"correctness": 1.4, "completeness": 0.5, "quality": -0.2, "feedback": "Name the city.\n"}
    server.text([json.dumps(reply)])
    reviewer = ClaudeFeedback(KEY, "claude-test", base_url=server.base_url, max_retries=0)
    task = task_event()
    try:
        feedback = await reviewer.feedback(task, result_event(task, ["step one"], PARIS_CALL))
    finally:
        await reviewer.aclose()
    assert feedback.source == "claude" and feedback.text == "Name the city."
    assert feedback.dimensions == {"correctness": 1.0, "completeness": 0.5, "quality": 0.0}
    assert feedback.score == pytest.approx(0.5)
    content = server.last_request.json["messages"][0]["content"]
    assert WEATHER in content and "1. step one" in content and PARIS_CALL in content


@pytest.mark.parametrize("failure", ["error", "not json", "missing"])
async def test_claude_feedback_falls_back_offline_and_says_why(server: MessagesServer, failure: str) -> None:
    if failure == "error":
        server.error(529)
    else:
        server.text(["no idea" if failure == "not json" else '{"correctness": 1, "quality": 1}'])
    reviewer = ClaudeFeedback(KEY, "claude-test", base_url=server.base_url, max_retries=0)
    try:
        feedback = await reviewer.assess(WEATHER, [], PARIS_CALL)
    finally:
        await reviewer.aclose()
    offline_text = OfflineFeedback().assess(WEATHER, [], PARIS_CALL).text
    assert feedback.source == "offline" and feedback.text.startswith("offline (Claude failed: ")
    assert feedback.text.endswith(f"): {offline_text}") and "\n" not in feedback.text
    assert feedback.score == OfflineFeedback().assess(WEATHER, [], PARIS_CALL).score


def test_parse_feedback_needs_numbers() -> None:
    assert parse_feedback('{"correctness": 1, "completeness": 1, "quality": 0.5}').text == ""
    with pytest.raises(ValueError, match="'quality' is not a number"):
        parse_feedback('{"correctness": 1, "completeness": 1, "quality": "good"}')
