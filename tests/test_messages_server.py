"""The real `anthropic` SDK over real HTTP against tests/messages_server.py: streaming text, a tool-use round
trip, prompt-caching fields, HTTP errors, a dropped stream, timeouts and retry-after. These pin down the
wire behaviour (and the exception classes) that the diagnosis chat relies on."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import MessageParam, TextBlock, TextBlockParam, ToolParam, ToolUseBlock
from messages_server import MessagesServer, Reply, text_block, tool_block

MODEL = "claude-test-model"
KEY = "sk-ant-test-0123456789"
USER: list[MessageParam] = [{"role": "user", "content": "Why did the reward collapse?"}]
TOOLS: list[ToolParam] = [
    {
        "name": "list_runs",
        "description": "List the runs in the store.",
        "input_schema": {"type": "object", "properties": {}},
    },
    {
        "name": "get_metric",
        "description": "One metric series of a run.",
        "input_schema": {
            "type": "object",
            "properties": {"run_id": {"type": "integer"}, "key": {"type": "string"}},
            "required": ["run_id", "key"],
        },
    },
]


def make_client(server: MessagesServer, **kwargs: Any) -> anthropic.Anthropic:
    kwargs.setdefault("max_retries", 0)
    return anthropic.Anthropic(api_key=KEY, base_url=server.base_url, **kwargs)


@pytest.fixture
def client(server: MessagesServer) -> Iterator[anthropic.Anthropic]:
    with make_client(server) as c:
        yield c


# --------------------------------------------------------------------------------------------- streaming


def test_stream_text_chunks_and_final_message(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.text(["The reward ", "collapsed at ", "step 40."])
    with client.messages.stream(model=MODEL, max_tokens=256, messages=USER) as stream:
        chunks = list(stream.text_stream)
        final = stream.get_final_message()
    assert chunks == ["The reward ", "collapsed at ", "step 40."]
    assert final.stop_reason == "end_turn"
    assert final.id.startswith("msg_")
    assert final.model == MODEL
    assert isinstance(final.content[0], TextBlock)
    assert final.content[0].text == "The reward collapsed at step 40."
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    assert final.usage.cache_creation_input_tokens == 0 and final.usage.cache_read_input_tokens == 0

    req = server.last_request
    assert (req.method, req.path) == ("POST", "/v1/messages")
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.api_key == KEY
    assert "x-api-key" not in req.headers
    assert req.headers["anthropic-version"]  # 2026-10-21 in SDK 2.12.0
    assert req.json["stream"] is True
    assert req.json["model"] == MODEL
    assert req.json["messages"] == USER
    for sampling in ("temperature", "top_p", "top_k"):
        assert sampling not in req.json


def test_stream_events_and_max_tokens_stop(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.text(["a", "b"], stop_reason="max_tokens")
    with client.messages.stream(model=MODEL, max_tokens=2, messages=USER) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert types.count("text") == 2
    assert final.stop_reason == "max_tokens"


def test_non_streaming_create_returns_a_full_message(
    server: MessagesServer, client: anthropic.Anthropic
) -> None:
    server.text(["Hello", " there"])
    message = client.messages.create(model=MODEL, max_tokens=64, messages=USER)
    assert isinstance(message.content[0], TextBlock)
    assert message.content[0].text == "Hello there"
    assert message.stop_reason == "end_turn"
    assert "stream" not in server.last_request.json or server.last_request.json["stream"] is False


def test_sampling_parameters_are_rejected_by_the_sdk(client: anthropic.Anthropic) -> None:
    with pytest.raises(TypeError):
        client.messages.create(model=MODEL, max_tokens=8, messages=USER, temperature=0.2)  # type: ignore[call-arg]


def test_keep_alive_connection_is_reused(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.text(["one"]).text(["two"])
    client.messages.create(model=MODEL, max_tokens=8, messages=USER)
    with client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream:
        assert stream.get_final_text() == "two"
    server.text(["three"])
    assert client.messages.create(model=MODEL, max_tokens=8, messages=USER).content[0].type == "text"
    assert all(r.headers.get("connection") == "keep-alive" for r in server.requests)
    # JSON (content-length) and SSE (chunked) replies both leave the connection reusable
    assert len({r.client_port for r in server.requests}) == 1


# --------------------------------------------------------------------------------------------- tool use


def test_tool_use_round_trip(server: MessagesServer, client: anthropic.Anthropic) -> None:
    args = {"run_id": 3, "key": "reward/mean"}
    server.tool_use("get_metric", args, text_before="Let me look at the reward.", id="toolu_fixed01")
    server.text(["The mean reward fell ", "after step 40."])

    messages: list[MessageParam] = list(USER)
    partials: list[str] = []
    with client.messages.stream(model=MODEL, max_tokens=256, messages=messages, tools=TOOLS) as stream:
        for event in stream:
            if event.type == "input_json":
                partials.append(event.partial_json)
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    assert "".join(partials) == json.dumps(args) and len([p for p in partials if p]) >= 2
    text, tool = first.content
    assert isinstance(text, TextBlock) and text.text == "Let me look at the reward."
    assert isinstance(tool, ToolUseBlock)
    assert (tool.id, tool.name, tool.input) == ("toolu_fixed01", "get_metric", args)

    messages.append({"role": "assistant", "content": first.content})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "[1.0, 0.2]"}],
        }
    )
    with client.messages.stream(model=MODEL, max_tokens=256, messages=messages, tools=TOOLS) as stream:
        answer = stream.get_final_text()
    assert answer == "The mean reward fell after step 40."

    second = server.requests[1].json
    assistant = second["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][1] == {
        "type": "tool_use",
        "id": "toolu_fixed01",
        "name": "get_metric",
        "input": args,
    }
    result = second["messages"][2]["content"][0]
    assert result == {"type": "tool_result", "tool_use_id": "toolu_fixed01", "content": "[1.0, 0.2]"}
    assert second["tools"] == TOOLS


def test_generated_tool_ids_and_parallel_tool_calls(
    server: MessagesServer, client: anthropic.Anthropic
) -> None:
    server.message(
        text_block("Checking both."),
        tool_block("list_runs", {}),
        tool_block("get_metric", {"run_id": 1, "key": "loss"}),
        stop_reason="tool_use",
    )
    with client.messages.stream(model=MODEL, max_tokens=256, messages=USER, tools=TOOLS) as stream:
        final = stream.get_final_message()
    tools = [b for b in final.content if isinstance(b, ToolUseBlock)]
    assert [t.name for t in tools] == ["list_runs", "get_metric"]
    assert all(t.id.startswith("toolu_") for t in tools) and tools[0].id != tools[1].id
    assert tools[0].input == {} and tools[1].input == {"run_id": 1, "key": "loss"}


def test_responder_answers_dynamically() -> None:
    def responder(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]["content"]
        return Reply.text([f"echo: {last}"])

    with MessagesServer(responder=responder) as server, make_client(server) as c:
        reply = c.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "ping"}])
        assert isinstance(reply.content[0], TextBlock) and reply.content[0].text == "echo: ping"


# ------------------------------------------------------------------------------------------------ caching


def test_cache_control_is_sent_and_cache_stats_come_back(
    server: MessagesServer, client: anthropic.Anthropic
) -> None:
    system: list[TextBlockParam] = [
        {"type": "text", "text": "You diagnose RL runs. " * 20, "cache_control": {"type": "ephemeral"}}
    ]
    tools: list[ToolParam] = [TOOLS[0], {**TOOLS[1], "cache_control": {"type": "ephemeral"}}]
    server.text(["first"]).text(["second"])

    usages = []
    for _ in range(2):
        with client.messages.stream(
            model=MODEL, max_tokens=64, messages=USER, system=system, tools=tools
        ) as stream:
            usages.append(stream.get_final_message().usage)

    body = server.requests[0].json
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    first, second = usages
    assert first.cache_creation_input_tokens and first.cache_creation_input_tokens > 0
    assert first.cache_read_input_tokens == 0
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert second.cache_creation_input_tokens == 0


def test_top_level_cache_control(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.text(["ok"])
    client.messages.create(model=MODEL, max_tokens=8, messages=USER, cache_control={"type": "ephemeral"})
    assert server.last_request.json["cache_control"] == {"type": "ephemeral"}


# ------------------------------------------------------------------------------------------------- errors


def test_401_is_authentication_error(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.error(401, message="invalid x-api-key")
    with (
        pytest.raises(anthropic.AuthenticationError) as info,
        client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream,
    ):
        stream.get_final_message()
    exc = info.value
    assert exc.status_code == 401
    assert exc.type == "authentication_error" and exc.api_message == "invalid x-api-key"
    assert exc.request_id and exc.request_id.startswith("req_")


def test_server_side_key_check() -> None:
    with MessagesServer(api_key="sk-right") as server:
        server.text(["never sent"])
        with make_client(server) as wrong, pytest.raises(anthropic.AuthenticationError):
            wrong.messages.create(model=MODEL, max_tokens=8, messages=USER)
        assert server.pending == 1
        with anthropic.Anthropic(api_key="sk-right", base_url=server.base_url, max_retries=0) as right:
            assert right.messages.create(model=MODEL, max_tokens=8, messages=USER).stop_reason == "end_turn"


def test_429_is_rate_limit_error_with_retry_after(
    server: MessagesServer, client: anthropic.Anthropic
) -> None:
    server.error(429, retry_after=7)
    with pytest.raises(anthropic.RateLimitError) as info:
        client.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "7"
    assert info.value.type == "rate_limit_error"


def test_retry_after_is_honoured_when_retries_are_on(server: MessagesServer) -> None:
    server.error(429, retry_after=0.3).text(["after the wait"])
    with make_client(server, max_retries=1) as c:
        started = time.monotonic()
        message = c.messages.create(model=MODEL, max_tokens=8, messages=USER)
        waited = time.monotonic() - started
    assert isinstance(message.content[0], TextBlock) and message.content[0].text == "after the wait"
    assert waited >= 0.3
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1"]


def test_529_is_overloaded_error(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.error(529)
    with (
        pytest.raises(anthropic.OverloadedError) as info,
        client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream,
    ):
        stream.get_final_message()
    assert info.value.status_code == 529
    assert isinstance(info.value, anthropic.InternalServerError)
    assert info.value.type == "overloaded_error"


def test_500_is_internal_server_error(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.error(500)
    with pytest.raises(anthropic.InternalServerError) as info:
        client.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert type(info.value) is anthropic.InternalServerError
    assert info.value.type == "api_error"


def test_empty_script_is_a_clear_500(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.InternalServerError, match="enqueued nothing"):
        client.messages.create(model=MODEL, max_tokens=8, messages=USER)


def test_error_event_mid_stream_is_a_plain_api_status_error(
    server: MessagesServer, client: anthropic.Anthropic
) -> None:
    server.stream_error("overloaded_error", "Overloaded", after_chunks=1)
    got: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream,
    ):
        got.extend(stream.text_stream)
    # the HTTP status was 200, so the SDK cannot pick OverloadedError: it is the base class
    assert type(info.value) is anthropic.APIStatusError
    assert info.value.status_code == 200
    assert info.value.type == "overloaded_error"
    assert got == ["chunk0 "]


# --------------------------------------------------------------------------------- drops and timeouts


def test_dropped_stream_raises_the_raw_httpx2_error(
    server: MessagesServer, client: anthropic.Anthropic
) -> None:
    server.drop(after_chunks=2)
    got: list[str] = []
    # mid-body failures are NOT wrapped in anthropic.APIConnectionError: httpx2's own exception escapes
    with (
        pytest.raises(httpx2.RemoteProtocolError, match="incomplete chunked read"),
        client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream,
    ):
        got.extend(stream.text_stream)
    assert got == ["chunk0 ", "chunk1 "]
    assert not isinstance(httpx2.RemoteProtocolError("x"), anthropic.APIError)


def test_reset_stream_raises_httpx2_read_error(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.drop(after_chunks=1, reset=True)
    with (
        pytest.raises(httpx2.ReadError),
        client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as s,
    ):
        s.until_done()


def test_dropped_non_streaming_reply_is_api_connection_error(
    server: MessagesServer, client: anthropic.Anthropic
) -> None:
    server.drop(after_chunks=1)
    with pytest.raises(anthropic.APIConnectionError) as info:
        client.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert type(info.value) is anthropic.APIConnectionError
    assert isinstance(info.value.__cause__, httpx2.RemoteProtocolError)


def test_client_recovers_after_a_drop(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.drop(after_chunks=1).text(["fine again"])
    with (
        pytest.raises(httpx2.TransportError),
        client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream,
    ):
        stream.until_done()
    with client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream:
        assert stream.get_final_text() == "fine again"
    first, second = server.requests
    assert first.client_port != second.client_port  # the broken connection was not reused


def test_delay_before_headers_is_api_timeout_error(
    server: MessagesServer, client: anthropic.Anthropic
) -> None:
    server.delay(3.0)
    started = time.monotonic()
    with (
        pytest.raises(anthropic.APITimeoutError),
        client.messages.stream(model=MODEL, max_tokens=8, messages=USER, timeout=0.5) as stream,
    ):
        stream.until_done()
    assert time.monotonic() - started < 2.0
    assert server.last_request.headers["x-stainless-timeout"] == "0.5"


def test_stall_mid_stream_is_raw_httpx2_read_timeout(
    server: MessagesServer, client: anthropic.Anthropic
) -> None:
    server.text(["slow", "er"], chunk_delay=1.5)
    with (
        pytest.raises(httpx2.ReadTimeout),
        client.messages.stream(model=MODEL, max_tokens=8, messages=USER, timeout=0.5) as stream,
    ):
        stream.until_done()


def test_delayed_reply_within_timeout_arrives(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.delay(0.2, Reply.tool_use("list_runs", {}))
    with client.messages.stream(model=MODEL, max_tokens=8, messages=USER, timeout=5) as stream:
        assert stream.get_final_message().stop_reason == "tool_use"


# ------------------------------------------------------------------------------------------ misc server


def test_bad_requests_do_not_consume_the_script(server: MessagesServer, client: anthropic.Anthropic) -> None:
    server.text(["kept"])
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.post("/v1/messages", body={"model": MODEL, "messages": USER}, cast_to=object)
    with pytest.raises(anthropic.NotFoundError):
        client.post("/v1/nope", body={}, cast_to=object)
    assert server.pending == 1
    client.messages.create(model=MODEL, max_tokens=8, messages=USER)
    server.assert_all_used()
    assert [r.path for r in server.requests] == ["/v1/messages", "/v1/nope", "/v1/messages"]


async def test_async_client_streams(server: MessagesServer) -> None:
    server.text(["async ", "works"]).drop(after_chunks=1)
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=server.base_url, max_retries=0) as c:
        async with c.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream:
            chunks = [t async for t in stream.text_stream]
        assert chunks == ["async ", "works"]
        with pytest.raises(httpx2.RemoteProtocolError):
            async with c.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream:
                await stream.until_done()
    assert server.requests[0].headers["x-stainless-async"].startswith("async")
