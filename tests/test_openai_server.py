"""The OpenAI-compatible test server itself, driven with httpx: chat completions with log-probs and
token ids (vLLM's return_tokens_as_token_ids and return_token_ids), or a server that gives neither;
models, vLLM's runtime LoRA API, scripted errors, a required key, and held requests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai_server import OpenAIServer, logprob_of, token_id_of, tokens_of

USER = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def openai() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


def chat(server: OpenAIServer, **body: object) -> httpx.Response:
    payload = {"model": server.model, "messages": USER} | body
    return httpx.post(f"{server.base_url}/chat/completions", json=payload, timeout=10)


def test_a_scripted_reply_has_the_chat_completion_shape(openai: OpenAIServer) -> None:
    openai.reply("Hello there.")
    body = chat(openai).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "test-model" and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop" and choice["logprobs"] is None
    assert choice["message"] == {"role": "assistant", "content": "Hello there."}
    assert body["usage"]["completion_tokens"] == 2
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 2
    recorded = openai.requests[-1]
    assert (recorded.method, recorded.path) == ("POST", "/v1/chat/completions")
    assert recorded.json["messages"] == USER and recorded.headers["content-type"] == "application/json"


def test_replies_are_first_in_first_out_then_the_responder(openai: OpenAIServer) -> None:
    openai.reply("one", "two")
    openai.responder = lambda request: f"echo {request['messages'][-1]['content']}"
    contents = [chat(openai).json()["choices"][0]["message"]["content"] for _ in range(3)]
    assert contents == ["one", "two", "echo Say hello."]


def test_nothing_scripted_is_a_500_that_says_so(openai: OpenAIServer) -> None:
    response = chat(openai)
    assert response.status_code == 500 and "nothing scripted" in response.json()["message"]


def test_logprobs_cover_every_token_and_join_back_to_the_content(openai: OpenAIServer) -> None:
    openai.reply("The answer is  42.")
    choice = chat(openai, logprobs=True, top_logprobs=2).json()["choices"][0]
    entries = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == "The answer is  42." == choice["message"]["content"]
    assert all(e["logprob"] < 0 and bytes(e["bytes"]).decode() == e["token"] for e in entries)
    assert [len(e["top_logprobs"]) for e in entries] == [2] * len(entries)
    assert entries[0]["top_logprobs"][0]["token"] == entries[0]["token"]


def test_token_ids_come_as_vllm_gives_them(openai: OpenAIServer) -> None:
    openai.reply("call get_weather now")
    body = chat(openai, logprobs=True, return_tokens_as_token_ids=True, return_token_ids=True).json()
    choice = body["choices"][0]
    ids = [token_id_of(t) for t in tokens_of("call get_weather now")]
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{i}" for i in ids]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [
        logprob_of(t) for t in tokens_of("call get_weather now")
    ]
    assert choice["token_ids"] == ids and all(0 <= i < 512 for i in ids)
    assert body["prompt_token_ids"] == [token_id_of(t) for t in tokens_of("Say hello.")]


def test_a_server_without_them_gives_neither_log_probs_nor_ids() -> None:
    with OpenAIServer(behaviour=False) as server:
        server.reply("call get_weather now")
        body = chat(server, logprobs=True, return_tokens_as_token_ids=True, return_token_ids=True).json()
    choice = body["choices"][0]
    assert choice["logprobs"] is None and "token_ids" not in choice and "prompt_token_ids" not in body
    assert choice["message"]["content"] == "call get_weather now"


def test_max_tokens_cuts_the_reply_with_finish_reason_length(openai: OpenAIServer) -> None:
    openai.reply("one two three four")
    choice = chat(openai, max_tokens=2, logprobs=True).json()["choices"][0]
    assert choice["message"]["content"] == "one two" and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["content"]) == 2 and tokens_of("one two") == ["one", " two"]


def test_scripted_errors_and_bad_requests_have_vllms_error_shape(openai: OpenAIServer) -> None:
    openai.error(503, "overloaded").reply("after")
    failed = chat(openai)
    assert failed.status_code == 503
    assert failed.json() == {
        "object": "error",
        "message": "overloaded",
        "type": "InternalServerError",
        "param": None,
        "code": 503,
    }
    assert chat(openai).json()["choices"][0]["message"]["content"] == "after"
    assert chat(openai, messages=[]).status_code == 400
    assert httpx.get(f"{openai.base_url}/nowhere").status_code == 404


def adapter_dir(path: Path) -> str:
    """A directory the server accepts as an adapter (it reads adapter_config.json from its own disk)."""
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    return str(path)


def test_lora_adapters_load_list_serve_and_unload(openai: OpenAIServer, tmp_path: Path) -> None:
    base = openai.base_url
    first, second = adapter_dir(tmp_path / "ckpt" / "2"), adapter_dir(tmp_path / "ckpt" / "2b")
    loaded = httpx.post(f"{base}/load_lora_adapter", json={"lora_name": "v0002", "lora_path": first})
    assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'v0002' added successfully."
    again = httpx.post(f"{base}/load_lora_adapter", json={"lora_name": "v0002", "lora_path": first})
    assert again.status_code == 400 and "already been loaded" in again.json()["message"]
    inplace = {"lora_name": "v0002", "lora_path": second, "load_inplace": True}
    assert httpx.post(f"{base}/load_lora_adapter", json=inplace).status_code == 200
    models = httpx.get(f"{base}/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["parent"]) for m in models["data"]] == [("test-model", None), ("v0002", "test-model")]
    assert models["data"][1]["root"] == second and openai.adapters == {"v0002": second}

    openai.reply("from the adapter")
    assert chat(openai, model="v0002").json()["model"] == "v0002"

    unloaded = httpx.post(f"{base}/unload_lora_adapter", json={"lora_name": "v0002"})
    assert unloaded.status_code == 200 and "removed successfully" in unloaded.text
    missing = chat(openai, model="v0002")
    assert missing.status_code == 404
    assert missing.json()["message"] == "The model `v0002` does not exist." and missing.json()["code"] == 404
    gone = httpx.post(f"{base}/unload_lora_adapter", json={"lora_name": "v0002"})
    assert gone.status_code == 404 and "cannot be found" in gone.json()["message"]
    assert httpx.post(f"{base}/load_lora_adapter", json={"lora_name": "x"}).status_code == 400


def test_an_adapter_the_server_cannot_read_and_a_server_without_runtime_lora_are_refused_as_vllm_does(
    openai: OpenAIServer, tmp_path: Path
) -> None:
    nowhere = str(tmp_path / "not-on-this-disk")
    missing = httpx.post(
        f"{openai.base_url}/load_lora_adapter", json={"lora_name": "v1", "lora_path": nowhere}
    )
    assert missing.status_code == 404
    assert missing.json()["message"] == f"Loading lora v1 failed: No adapter found for {nowhere}"
    assert missing.json()["type"] == "NotFoundError" and openai.adapters == {}

    with OpenAIServer(runtime_lora=False) as plain:  # vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING
        body = {"lora_name": "v1", "lora_path": adapter_dir(tmp_path / "v1")}
        for route in ("load_lora_adapter", "unload_lora_adapter"):
            answer = httpx.post(f"{plain.base_url}/{route}", json=body)
            assert (answer.status_code, answer.json()) == (404, {"detail": "Not Found"})
        assert plain.adapters == {}


def test_a_required_key_turns_away_requests_without_it() -> None:
    with OpenAIServer(api_key="sk-local-123") as server:
        server.reply("ok")
        assert chat(server).status_code == 401
        url = f"{server.base_url}/chat/completions"
        payload = {"model": server.model, "messages": USER}
        ok = httpx.post(url, json=payload, headers={"Authorization": "Bearer sk-local-123"})
        assert ok.status_code == 200 and server.pending == 0


def test_held_requests_wait_until_released(openai: OpenAIServer) -> None:
    openai.hold(lambda request: "slow" in request["messages"][-1]["content"])
    openai.reply("fast", "slow done")
    results: list[str] = []
    slow = threading.Thread(
        target=lambda: results.append(
            chat(openai, messages=[{"role": "user", "content": "be slow"}]).json()["choices"][0]["message"][
                "content"
            ]
        )
    )
    slow.start()
    try:
        assert openai.wait_held(1)
        assert openai.held == 1 and results == []
        assert chat(openai).json()["choices"][0]["message"]["content"] == "fast"  # others pass
    finally:
        openai.release()
        slow.join(timeout=10)
    assert results == ["slow done"] and openai.held == 0


def test_close_releases_a_held_request() -> None:
    outcome: list[object] = []
    with OpenAIServer() as server:
        server.hold(lambda request: True)

        def call() -> None:
            try:
                outcome.append(chat(server).status_code)
            except httpx.HTTPError as exc:
                outcome.append(type(exc))

        caller = threading.Thread(target=call)
        caller.start()
        assert server.wait_held(1)
        server.close()  # the with block closes it again, which does nothing
        caller.join(timeout=10)
    assert not caller.is_alive() and len(outcome) == 1
