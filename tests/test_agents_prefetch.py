"""A worker asks for its next task while it answers one (no round trip to the server between two tasks),
and a task it fetched that way goes back to the stream at once when it stops, for another worker, instead
of after the ack wait. Real nats-server, a real http worker against the local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents_support import address_of, jetstream, nats_server
from openai_server import OpenAIServer

from engine.agents.backends import Answer, ModelBackend
from engine.agents.bus import STREAM, close, fetch, publish, pull
from engine.agents.config import AgentsSettings
from engine.agents.events import ControlEvent, ResultEvent, TaskEvent, parse_event
from engine.agents.worker import INLINE_ANSWER_S, Worker, run_worker

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


class ThreadNoting(ModelBackend):
    """The real tiny model; each answer notes the thread it ran on and how long it took, after `pause`
    seconds (a slower model)."""

    def __init__(self, settings: AgentsSettings, home: Path, pause: float) -> None:
        super().__init__(settings, home)
        super().answer(
            TaskEvent(manager_id="m", task_type="demo", prompt="warm up")
        )  # its first call is slow
        self.threads: list[int] = []
        self.took: list[float] = []
        self.pause = pause

    def answer(self, task: TaskEvent) -> Answer:
        self.threads.append(threading.get_ident())
        began = time.monotonic()
        time.sleep(self.pause)
        answer = super().answer(task)
        self.took.append(time.monotonic() - began)
        return answer


async def answered_on(tmp_path: Path, home: Path, pause: float, n: int = 4) -> ThreadNoting:
    """A model worker in this process that answered `n` tasks: on which threads, in order, and how fast."""
    settings = AgentsSettings(worker_kind="model", max_new_tokens=8)
    backend = ThreadNoting(settings, home, pause)
    with nats_server(tmp_path / "nats") as server:
        nc, js = await jetstream(address_of(server))
        worker = Worker(address_of(server), settings, backend, worker_id="w1", home=home)
        running = asyncio.create_task(worker.run())
        results = await pull(js, "results.demo", "test-results", ack_wait=60)
        for i in range(n):
            await publish(js, TaskEvent(manager_id="m", task_type="demo", prompt=f"What is {i} + 1?"))
        got: list[object] = []
        deadline = time.monotonic() + 60
        while len(got) < n:
            assert time.monotonic() < deadline, f"{len(got)} of {n} results"
            got += [parse_event(m.subject, m.data) for m in await fetch(results, n, 1.0)]
        worker.stop.set()
        await asyncio.wait_for(running, 30)
        await close(nc)
    assert all(isinstance(r, ResultEvent) and r.status == "success" for r in got)
    return backend


async def test_a_fast_local_model_answers_on_the_loops_thread_after_its_first_task(
    tmp_path: Path, tiny_home: Path
) -> None:
    """Handed to a thread, a local model's Python competes for the GIL with the event loop's (bench:
    2-3 ms a task on the tiny model). The first answer, of unknown length, goes to a thread; once the model
    is known to answer in under INLINE_ANSWER_S, the next ones run on the loop's own thread."""
    backend = await answered_on(tmp_path, tiny_home, pause=0.0)
    loop_thread = threading.get_ident()
    assert backend.threads[0] != loop_thread
    for before, thread in zip(backend.took, backend.threads[1:], strict=False):
        if abs(before - INLINE_ANSWER_S) > 0.05:  # (the worker's own clock also counts a thread's hand-off)
            assert (thread == loop_thread) == (before < INLINE_ANSWER_S), (before, backend.took)
    assert loop_thread in backend.threads  # the warm tiny model answers in tens of ms


async def test_a_slow_local_model_answers_on_a_thread_so_the_loop_stays_free(
    tmp_path: Path, tiny_home: Path
) -> None:
    backend = await answered_on(tmp_path, tiny_home, pause=INLINE_ANSWER_S + 0.05, n=2)
    assert threading.get_ident() not in backend.threads
