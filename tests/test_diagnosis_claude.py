"""The diagnosis client for real: the anthropic SDK over HTTP to tests/messages_server.py, against a
run in a real store. Streaming, a tool round trip answered from the store, prompt caching in the
request, and every error as one line that leaves the chat usable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from messages_server import MessagesServer, Reply
from test_diagnosis import grpo_run, rollout_run

from engine.diagnosis.chat import INSTRUCTIONS, ChatEvent, Diagnoser
from engine.store import Store

KEY = "sk-ant-test-key-0123456789abcdef"


@pytest.fixture
def run_id(store: Store) -> int:
    return grpo_run(store, "claude-run", 80)


def diagnoser(store: Store, server: MessagesServer, run_id: int, **kwargs: object) -> Diagnoser:
    kwargs.setdefault("timeout", 5.0)
    return Diagnoser(store.path, run_id, api_key=KEY, model="claude-test", base_url=server.base_url, **kwargs)  # type: ignore[arg-type]


def turn(d: Diagnoser, question: str, history: list[dict[str, str]] | None = None) -> list[ChatEvent]:
    return list(d.ask(question, history))


def test_streams_text_with_cached_digest_and_tools(store: Store, server: MessagesServer, run_id: int) -> None:
    server.text(["The task reward ", "rose from 0.2 ", "to 0.8."])
    events = turn(diagnoser(store, server, run_id), "how is it going?")
    assert [e.text for e in events if e.kind == "text"] == ["The task reward ", "rose from 0.2 ", "to 0.8."]
    done = events[-1]
    assert done.kind == "done" and done.data["answer"] == "The task reward rose from 0.2 to 0.8."
    assert done.data["usage"]["input_tokens"] > 0 and done.data["usage"]["cache_creation_input_tokens"] > 0
    request = server.last_request
    assert request.headers["authorization"] == f"Bearer {KEY}"
    body = request.json
    assert body["model"] == "claude-test" and body["stream"] is True
    assert "temperature" not in body and "top_p" not in body
    # The system prompt holds the instructions alone; the digest, which holds what other tools wrote, is data
    # in the first user message, fenced and cached.
    assert [block["text"] for block in body["system"]] == [INSTRUCTIONS]
    [message] = body["messages"]
    digest_block, question = message["content"]
    assert message["role"] == "user" and question == {"type": "text", "text": "how is it going?"}
    assert digest_block["cache_control"] == {"type": "ephemeral"}
    assert digest_block["text"].startswith("<run_digest>\n") and digest_block["text"].endswith(
        "\n</run_digest>"
    )
    assert "RUN claude-run" in digest_block["text"] and "rewards/task/mean" in digest_block["text"]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}


def test_a_follow_up_reads_the_cache_and_carries_the_history(
    store: Store, server: MessagesServer, run_id: int
) -> None:
    d = diagnoser(store, server, run_id)
    server.text(["First answer."]).text(["Second answer."])
    turn(d, "first?")
    events = turn(
        d,
        "second?",
        [{"role": "user", "content": "first?"}, {"role": "assistant", "content": "First answer."}],
    )
    assert events[-1].data["usage"]["cache_read_input_tokens"] > 0
    first, answer, second = server.last_request.json["messages"]
    assert [block.get("text") for block in first["content"]][1:] == ["first?"]  # after the digest
    assert first["content"][0]["text"].startswith("<run_digest>")
    assert [answer["content"], second["content"]] == ["First answer.", "second?"]


def test_a_tool_round_trip_answers_from_the_store(store: Store, server: MessagesServer, run_id: int) -> None:
    server.tool_use(
        "get_metric",
        {"key": "rewards/task/mean", "start_step": 1, "end_step": 3},
        text_before="Let me check.",
    )
    server.text(["It starts near 0.2."])
    events = turn(diagnoser(store, server, run_id), "what was the task reward at the start?")
    kinds = [e.kind for e in events]
    assert kinds.index("tool_call") < kinds.index("tool_result") < len(kinds) - 1
    call = next(e for e in events if e.kind == "tool_call")
    assert call.data["name"] == "get_metric" and call.data["input"]["key"] == "rewards/task/mean"
    done = events[-1]
    assert done.data["answer"] == "Let me check.It starts near 0.2."
    assert done.data["tool_calls"][0]["name"] == "get_metric" and not done.data["tool_calls"][0]["error"]
    first, second = server.requests[-2:]
    tool_use_id = first_tool_use_id(second.json)
    result = second.json["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == tool_use_id
    points = json.loads(result["content"])["points"]
    stored = dict(
        store.conn.execute(
            "SELECT step, value FROM metrics WHERE run_id=? AND key='rewards/task/mean' AND step<=3",
            (run_id,),
        )
    )
    assert [p[0] for p in points] == [1, 2, 3]
    assert [p[1] for p in points] == pytest.approx([stored[s] for s in (1, 2, 3)], abs=1e-6)


def test_what_the_policy_says_when_reward_drops(store: Store, server: MessagesServer) -> None:
    """The model looks for the drop, reads that step's worst rollouts, then one rollout's token entropies:
    each tool call is answered from the rollouts table."""
    run_id = rollout_run(store)
    server.tool_use("find_metrics", {"pattern": "reward"}, text_before="Let me find the drop. ")
    server.tool_use("get_rollouts", {"step": 6, "pick": "worst", "limit": 2})

    def respond(body: dict) -> Reply | None:
        result = json.loads(body["messages"][-1]["content"][0]["content"])
        if "rollouts" in result:  # read the worst one's tokens
            return Reply.tool_use("get_rollout_tokens", {"rollout_id": result["rollouts"][0]["id"]})
        worst = "".join(t[0] + " " for t in result["tokens"]).strip()
        return Reply.text([f"At step {result['step']} the worst answers refuse: {worst!r}."])

    server.responder = respond
    events = turn(diagnoser(store, server, run_id), "show me what the policy says when reward drops")
    calls = [e.data for e in events if e.kind == "tool_call"]
    assert [c["name"] for c in calls] == ["find_metrics", "get_rollouts", "get_rollout_tokens"]
    assert not any(e.data.get("error") for e in events if e.kind == "tool_result")
    assert (
        events[-1].data["answer"]
        == "Let me find the drop. At step 6 the worst answers refuse: 'I cannot help with that.'."
    )
    assert {t["name"] for t in server.requests[0].json["tools"]} >= {"get_rollouts", "get_rollout_tokens"}
    sent = [json.loads(r.json["messages"][-1]["content"][0]["content"]) for r in server.requests[1:]]
    assert [p for p in sent[0]["series"]["reward"]["points"] if p[1] < 0.5] == [[6, 0.2]]
    stored = {
        idx: (completion, total)
        for idx, completion, total in store.conn.execute(
            "SELECT idx, completion, total FROM rollouts WHERE run_id=? AND step=6", (run_id,)
        )
    }
    worst = sorted(stored.items(), key=lambda item: item[1][1])[:2]
    assert [(r["idx"], r["completion"], r["total"]) for r in sent[1]["rollouts"]] == [
        (idx, completion, total) for idx, (completion, total) in worst
    ]
    assert sent[2]["id"] == sent[1]["rollouts"][0]["id"] and sent[2]["columns"] == [
        "token",
        "entropy",
        "logprob",
    ]


def first_tool_use_id(body: dict) -> str:
    assistant = body["messages"][-2]
    return next(b["id"] for b in assistant["content"] if b["type"] == "tool_use")


def test_a_bad_tool_call_goes_back_as_an_error(store: Store, server: MessagesServer, run_id: int) -> None:
    server.tool_use("get_metric", {"key": "no/such/key"}).text(["That key does not exist."])
    events = turn(diagnoser(store, server, run_id), "?")
    result = next(e for e in events if e.kind == "tool_result")
    assert result.data["error"] and "no metric 'no/such/key'" in result.text
    sent = server.last_request.json["messages"][-1]["content"][0]
    assert sent["is_error"] is True and "no metric" in sent["content"]
    assert events[-1].kind == "done"


@pytest.mark.parametrize(
    ("script", "line"),
    [
        (lambda s: s.error(401), "Claude refused the API key (401)"),
        (lambda s: s.error(429, retry_after=999), "rate limited by Claude (429, retry after 999s)"),
        (lambda s: s.error(529).error(529), "Claude is overloaded (529)"),
        (lambda s: s.error(404, message="model: claude-test"), "unknown model 'claude-test' (404)"),
        (lambda s: s.drop(after_chunks=2, chunks=["partial ", "answer ", "lost"]), "dropped mid-answer"),
        (lambda s: s.delay(3.0), "did not answer within 1s (timeout)"),
        (lambda s: s.stream_error("overloaded_error", after_chunks=1), "Claude is overloaded (529)"),
    ],
)
def test_errors_are_one_line_and_the_chat_stays_usable(
    store: Store, server: MessagesServer, run_id: int, script: object, line: str
) -> None:
    slept: list[float] = []
    d = diagnoser(store, server, run_id, timeout=1.0, sleep=slept.append)
    script(server)  # type: ignore[operator]
    events = turn(d, "why?")
    error = events[-1]
    assert error.kind == "error" and line in error.text and "\n" not in error.text
    assert KEY not in error.text
    server.text(["Back to normal."])
    assert turn(d, "again?")[-1].data["answer"] == "Back to normal."


def test_a_rate_limit_is_retried_after_the_servers_delay(
    store: Store, server: MessagesServer, run_id: int
) -> None:
    slept: list[float] = []
    d = diagnoser(store, server, run_id, sleep=slept.append)
    server.error(429, retry_after=7).text(["Answer after the wait."])
    events = turn(d, "?")
    assert slept == [7.0]
    assert any(e.kind == "status" and "retrying in 7s" in e.text for e in events)
    assert events[-1].data["answer"] == "Answer after the wait."


def test_without_a_key_the_offline_analyst_answers(
    store: Store, run_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    d = Diagnoser(store.path, run_id)
    assert d.offline and d.offline_reason() == "no ANTHROPIC_API_KEY"
    events = turn(d, "how is it going?")
    assert events[-1].data["offline"] and events[0].text.startswith("**Offline analyst**")


def test_the_key_is_never_stored(store: Store, server: MessagesServer, run_id: int, tmp_path: Path) -> None:
    from engine.diagnosis.carl_diagnose import diagnose

    server.text(["ok"])
    home = Path(store.path).parent
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        code = diagnose(home, "claude-run", "why?", api_key=KEY, base_url=server.base_url, out=out, err=err)
    assert code == 0 and (tmp_path / "out").read_text() == "ok\n"
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for path in home.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
