"""A worker asks for its next task while it answers one (no round trip to the server between two tasks),
and a task it fetched that way goes back to the stream at once when it stops, for another worker, instead
of after the ack wait. Real nats-server, a real http worker against the local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents_support import address_of, jetstream, nats_server
from openai_server import OpenAIServer

from engine.agents.bus import STREAM, close, fetch, publish, pull
from engine.agents.events import ControlEvent, ResultEvent, TaskEvent, parse_event
from engine.agents.plane_settings import AgentsSettings
from engine.agents.worker import run_worker

pytestmark = pytest.mark.slow


@pytest.fixture
def gc_as_it_was() -> Iterator[None]:
    """run_worker sets the garbage collector for a worker process; this test process gets it back."""
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("gc_as_it_was")
async def test_a_task_fetched_ahead_goes_back_at_once_when_the_worker_stops(tmp_path: Path) -> None:
    def answer(request: dict) -> str:
        return "<step>Look it up.</step><answer>x</answer>"

    with nats_server(tmp_path / "nats") as server, OpenAIServer(responder=answer) as llm:
        llm.hold(lambda body: True)  # the first task's answer waits: the worker is busy with it
        settings = AgentsSettings(
            worker_kind="http", endpoint=llm.base_url, endpoint_model=llm.model, ack_wait_s=60
        )
        nc, js = await jetstream(address_of(server))
        tasks = [TaskEvent(manager_id="m", task_type="demo", prompt=f"task {i}") for i in range(2)]
        for task in tasks:
            await publish(js, task)
        worker = asyncio.create_task(
            run_worker(address_of(server), settings, kind="http", home=tmp_path / "home", worker_id="w1")
        )
        assert await asyncio.to_thread(llm.wait_held, 1, 30.0)
        deadline = time.monotonic() + 30
        while (await js.consumer_info(STREAM, "workers-demo")).num_ack_pending < 2:  # the second: in hand too
            assert time.monotonic() < deadline, "the worker never fetched its next task ahead"
            await asyncio.sleep(0.05)
        assert llm.held == 1  # one answered at a time

        await publish(js, ControlEvent(action="stop_worker", target="w1"))
        llm.release()
        await asyncio.wait_for(worker, 30)

        result = await js.get_last_msg(STREAM, "results.demo")
        answered = parse_event(result.subject, result.data)
        assert isinstance(answered, ResultEvent) and answered.task_id == tasks[0].task_id
        # The second task is there for the next worker now, not after the 60 s ack wait.
        sub = await pull(js, "tasks.demo", "workers-demo", ack_wait=60)
        began = time.monotonic()
        msgs = await fetch(sub, 1, 10.0)
        assert len(msgs) == 1 and time.monotonic() - began < 5
        assert parse_event(msgs[0].subject, msgs[0].data).task_id == tasks[1].task_id  # type: ignore[union-attr]
        assert msgs[0].metadata.num_delivered == 2
        await close(nc)
