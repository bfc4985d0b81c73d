"""The agents plane's speed, against baselines measured in the same run. Goals (2 cores):

1. Events from publish to stored row: >= 20,000/s. A publisher process sends a realistic mix of plane
   events (results and rollouts with their token ids and log-probs, feedback, tasks) to the JetStream
   stream as fast as the server acknowledges them, while the audit (the engine's bridge code, in a
   process of its own) stores them in a fresh carl.db. Rate = events / (last row committed - first
   publish). Baseline: the same events written straight into a store by the same AuditWriter, with no
   bus at all (the ratio says what the bus costs). Printed beside it: the CPU each part spent per event
   (the audit, the publisher, nats-server), which a loaded machine's wall clock does not hide.
2. Bus hop latency on loopback: p99 <= 5 ms. One task at a time goes from a publish (acknowledged by
   the stream) to a worker's pull consumer waiting in `fetch`, as the manager hands a task to a worker.
   Baseline: a core NATS publish to a plain subscriber on the same server.
3. The plane's overhead per task: <= 5%. One worker answers N demo tasks through the plane (manager,
   bus, worker process, scoring, audit), against the same worker code answering the same tasks in a
   loop with no plane, in a process started as a worker's is (the same environment, the garbage collector
   set as a worker process sets it), so that the plane is the only difference. Twice: a model worker on
   the built-in tiny model (both draw the same samples: same seed, same order), and an http worker against an
   OpenAI-compatible server that takes 100 ms an answer, as a model served on a GPU does.

    python bench/bench_agents.py [--events 60000] [--hops 2000] [--tasks 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.agents.audit import AuditWriter, Incoming  # noqa: E402
from engine.agents.bus import Address, close, connect, ensure_stream, fetch, pull  # noqa: E402
from engine.agents.events import (  # noqa: E402
    FeedbackEvent,
    PlaneEvent,
    ResultEvent,
    TaskEvent,
    TrainingRolloutEvent,
)
from engine.agents.plane_settings import AgentsSettings  # noqa: E402
from engine.agents.server import LocalServer, free_port, token_path  # noqa: E402
from engine.store import Store  # noqa: E402

GOAL_EVENTS_PER_S = 20_000
GOAL_HOP_P99_MS = 5.0
GOAL_OVERHEAD = 0.05


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def event_mix(n: int) -> list[PlaneEvent]:
    """n events in the proportions a running plane produces them: task, result, rollout, feedback."""
    out: list[PlaneEvent] = []
    tokens = list(range(100, 148))
    logprobs = [-0.5 - (i % 7) / 10 for i in range(48)]
    steps = ["Find the tool for the weather.", "Call it for Sydney."]
    for i in range(n // 4 + 1):
        task = TaskEvent(
            manager_id="manager",
            task_type="demo",
            prompt=f"What is the weather in Sydney? ({i})",
            reference='{"tool": "weather", "args": {"city": "Sydney"}}',
            verifier="demo",
        )
        worker = f"w{i % 4 + 1}"
        answer = '{"tool": "weather", "args": {"city": "Sydney"}}'
        result = ResultEvent(
            task_id=task.task_id,
            worker_id=worker,
            task_type="demo",
            prompt=task.prompt,
            status="success",
            result=f"<step>{steps[0]}</step><step>{steps[1]}</step><answer>{answer}</answer>",
            steps=steps,
            answer=answer,
            elapsed_seconds=0.08,
            model_version="base",
            worker_kind="model",
            prompt_token_ids=tokens[:20],
            response_token_ids=tokens,
            token_logprobs=logprobs,
            temperature=1.0,
            phi_mean=0.93,
        )
        rollout = TrainingRolloutEvent(
            task_id=task.task_id,
            worker_id=worker,
            task_type="demo",
            prompt=task.prompt,
            response=answer,
            steps=steps,
            step_scores=[0.7, 0.9],
            prm_score=0.8,
            outcome_score=0.78,
            verifier_score=1.0,
            reward=0.89,
            model_version="base",
            prompt_token_ids=tokens[:20],
            response_token_ids=tokens,
            token_logprobs=logprobs,
            temperature=1.0,
        )
        feedback = FeedbackEvent(
            task_id=task.task_id,
            manager_id="manager",
            worker_id=worker,
            score=0.85,
            textual_feedback="A sound, complete and clean answer.",
        )
        out += [task, result, rollout, feedback]
    return out[:n]


# -- 1. throughput --------------------------------------------------------------------------------


AUDITOR = """
import asyncio, json, sys, time
sys.path.insert(0, {root!r})
from engine.agents.audit import AuditWriter, run_audit
from engine.agents.bus import Address, close, connect, ensure_stream
from engine.agents.plane_settings import AgentsSettings
from engine.store import Store

async def main():
    expected = {expected}
    store = Store({db!r})
    nc = await connect(Address({url!r}, {token!r}), "bench-audit")
    js = nc.jetstream()
    await ensure_stream(js, AgentsSettings().stream)
    stop = asyncio.Event()
    stored = 0
    def on_batch(counts):
        nonlocal stored
        stored += counts.stored + counts.rejected + counts.duplicates
        if stored >= expected:
            cpu = time.process_time() - ready_cpu
            print(json.dumps({{"done_at": time.time(), "stored": stored, "cpu_s": cpu}}), flush=True)
            stop.set()
    ready_cpu = time.process_time()
    print("ready", flush=True)
    await run_audit(js, AuditWriter(store), stop, on_batch=on_batch)
    await close(nc)

asyncio.run(main())
"""


async def publish_all(address: Address, events: list[PlaneEvent], window: int = 4000) -> tuple[float, float]:
    """Publish every event (each with its message id) to the stream, at most `window` of them waiting for
    the stream's acknowledgement; returns the wall time of the first publish and the CPU seconds the
    publishing took. Every acknowledgement is read and checked for an error.

    Each publish names a reply subject of its own, and one subscription counts the acknowledgements, as
    a plane of many publishers (workers, the manager) sends them. (nats-py's `publish_async` keeps a
    future, a semaphore slot and a parsed acknowledgement per event: about 30 us of CPU an event, which
    on two cores is taken from the audit being measured; this costs about a third of that.)"""
    nc = await connect(address, "bench-publisher")
    await ensure_stream(nc.jetstream(), AgentsSettings().stream)
    payloads = [(e.subject(), e.encode(), {"Nats-Msg-Id": e.dedup_id()}) for e in events]
    inbox = nc.new_inbox()
    sent = acked = 0
    refused: list[bytes] = []
    room = asyncio.Event()

    async def on_ack(msg: Any) -> None:
        nonlocal acked
        acked += 1
        if b'"error"' in msg.data:
            refused.append(msg.data)
        if sent - acked <= window // 2:
            room.set()

    await nc.subscribe(f"{inbox}.*", cb=on_ack, pending_msgs_limit=4 * window)
    # The events were made up front; a real publisher holds only the one it sends. Set them aside from
    # the garbage collector so that the bench does not time collections of its own test data.
    gc.collect()
    gc.freeze()
    started, cpu = time.time(), time.process_time()
    for subject, data, headers in payloads:
        if sent - acked >= window:
            room.clear()
            await room.wait()
        await nc.publish(subject, data, reply=f"{inbox}.{sent}", headers=headers)
        sent += 1
    while acked < sent:
        room.clear()
        await asyncio.wait_for(room.wait(), 30)
    cpu = time.process_time() - cpu
    await close(nc)
    if refused:
        raise RuntimeError(f"the stream refused {len(refused)} events; first: {refused[0][:200]!r}")
    return started, cpu


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_throughput(n: int) -> dict[str, float]:
    events = event_mix(n)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        # Baseline: the same events, written by the same AuditWriter, with no bus.
        items = [Incoming(e.subject(), e.encode(), i + 1, f"0:{i + 1}") for i, e in enumerate(events)]
        with Store(home / "direct.db") as store:
            writer = AuditWriter(store)
            began = time.perf_counter()
            for start in range(0, len(items), 2000):
                writer.write(items[start : start + 2000])
            direct_s = time.perf_counter() - began
        server = LocalServer(home, free_port())
        server.start()
        try:
            code = AUDITOR.format(
                root=str(Path(__file__).resolve().parent.parent),
                expected=n,
                db=str(home / "carl.db"),
                url=server.url,
                token=str(token_path(home)),
            )
            auditor = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            assert auditor.stdout is not None
            assert auditor.stdout.readline().strip() == "ready"
            assert server.proc is not None
            server_cpu = cpu_seconds(server.proc.pid)
            started, publisher_cpu = asyncio.run(
                publish_all(Address(server.url, str(token_path(home))), events)
            )
            report = json.loads(auditor.stdout.readline())
            server_cpu = cpu_seconds(server.proc.pid) - server_cpu
            auditor.wait(30)
        finally:
            server.stop()
        with Store(home / "carl.db") as store:
            stored = store.conn.execute("SELECT count(*) FROM agent_events").fetchone()[0]
    plane_rate = n / (report["done_at"] - started)
    direct_rate = n / direct_s
    return {
        "events": n,
        "stored": stored,
        "plane_per_s": plane_rate,
        "direct_per_s": direct_rate,
        # CPU per event, each part of the path: what a loaded machine's wall clock hides
        "publisher_us": publisher_cpu / n * 1e6,
        "audit_us": report["cpu_s"] / n * 1e6,
        "server_us": server_cpu / n * 1e6,
    }


# -- 2. hop latency ---------------------------------------------------------------------------------


async def hops(address: Address, n: int) -> dict[str, list[float]]:
    nc = await connect(address, "bench-hops")
    js = nc.jetstream()
    await ensure_stream(js, AgentsSettings().stream)
    sub = await pull(js, "tasks.hop", "workers-hop", ack_wait=30)
    received: asyncio.Queue[float] = asyncio.Queue()

    async def worker() -> None:
        while True:
            for msg in await fetch(sub, 1, 5.0):
                received.put_nowait(time.perf_counter())
                await msg.ack()

    consumer = asyncio.create_task(worker())
    jetstream_ms = []
    for i in range(n):
        event = TaskEvent(manager_id="manager", task_type="hop", prompt=f"hop {i}")
        sent = time.perf_counter()
        await js.publish(event.subject(), event.encode(), headers={"Nats-Msg-Id": event.dedup_id()})
        jetstream_ms.append((await received.get() - sent) * 1000)
    consumer.cancel()

    core_received: asyncio.Queue[float] = asyncio.Queue()

    async def on_core(msg: object) -> None:
        core_received.put_nowait(time.perf_counter())

    await nc.subscribe("bench.core", cb=on_core)
    core_ms = []
    for i in range(n):
        sent = time.perf_counter()
        await nc.publish("bench.core", f"hop {i}".encode())
        await nc.flush()
        core_ms.append((await core_received.get() - sent) * 1000)
    await close(nc)
    return {"jetstream": jetstream_ms, "core": core_ms}


def bench_hops(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        server = LocalServer(home, free_port())
        server.start()
        try:
            got = asyncio.run(hops(Address(server.url, str(token_path(home))), n))
        finally:
            server.stop()
    return {f"{kind}_{q}": percentile(values[20:], q) for kind, values in got.items() for q in (50, 99)}


# -- 3. plane overhead per task ------------------------------------------------------------------------


MODEL_SERVER = """
import sys, time
sys.path.insert(0, {tests!r})
from openai_server import OpenAIServer

def answer(request):
    time.sleep({latency!r})
    return (
        "<step>Call the tool for the city.</step><answer>" + request["messages"][-1]["content"] + "</answer>"
    )

with OpenAIServer(responder=answer) as server:
    print(server.base_url, server.model, flush=True)
    sys.stdin.read()  # until the bench closes it
"""


DIRECT_WORKER = """
import gc, json, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from engine.agents.plane_settings import AgentsSettings
from engine.agents.tasks import demo_tasks
from engine.agents.backends import HttpBackend, ModelBackend

settings = AgentsSettings.model_validate_json({settings!r})
specs = demo_tasks()[:{n}]
backend = ModelBackend(settings, Path({home!r})) if {kind!r} == "model" else HttpBackend(settings)
backend.answer(specs[0].event("manager"))
gc.collect()
gc.freeze()  # as a worker process does once its model is loaded (engine/agents/worker.py)
began = time.perf_counter()
for spec in specs[1:]:
    backend.answer(spec.event("manager"))
print(json.dumps((time.perf_counter() - began) / (len(specs) - 1)))
backend.close()
"""


def direct_worker(home: Path, settings: AgentsSettings, n: int, kind: str) -> float:
    """Seconds a task for the worker's own backend answering the demo's first `n` tasks in a loop, with no
    plane: in a process started as a worker's is (the same interpreter and environment, engine/agents/
    launcher.py), so that the plane is the only difference between the two figures."""
    from engine.agents.launcher import child_env

    code = DIRECT_WORKER.format(
        root=str(Path(__file__).resolve().parent.parent),
        settings=settings.model_dump_json(),
        n=n,
        home=str(home),
        kind=kind,
    )
    env = child_env(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def model_server(latency_s: float) -> Iterator[tuple[str, str]]:
    """(base URL, model) of an OpenAI-compatible server that answers after `latency_s`
    (tests/openai_server.py), in a process of its own, as a model server on a GPU is: in the bench's process
    it would share one interpreter with the plane's manager and audit, and its answers would wait for them."""
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    code = MODEL_SERVER.format(tests=tests, latency=latency_s)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        url, model = proc.stdout.readline().split()
        yield url, model
    finally:
        proc.stdin.close()
        proc.wait(10)


def bench_overhead(
    n: int, *, rounds: int = 5, kind: str = "model", latency_s: float = 0.1
) -> dict[str, float]:
    """Steady state, per task: the time between two results, the first result excluded (start-up is not
    a per-task cost). Through the plane, the worker always has its next task waiting (concurrency 4).
    Rounds alternate direct and plane runs; each figure is the median of its rounds.

    kind "model": the built-in tiny model on this CPU (about 16 ms of CPU a task, and the plane's own
    processes share the two cores with it). kind "http": an OpenAI-compatible server that answers after
    `latency_s`, as a model served on a GPU does (`model_server`)."""
    from engine.agents.carl_agents import headless
    from engine.agents.tasks import demo_tasks
    from engine.models.tiny import build_tiny_model, default_model_dir

    specs = demo_tasks()[:n]
    direct, plane = [], []
    with tempfile.TemporaryDirectory() as tmp, model_server(latency_s) as (url, model):
        home = Path(tmp)
        settings = AgentsSettings(
            workers=1,
            worker_kind=kind,
            max_new_tokens=32,
            concurrency=4,
            ack_wait_s=120,
            endpoint=url,
            endpoint_model=model,
        )
        build_tiny_model(default_model_dir(home))
        for _ in range(rounds):
            # Direct: the worker's own backend, the same tasks in the same order (the same samples).
            direct.append(direct_worker(home, settings, n, kind))
            summary = asyncio.run(headless(home, settings, specs, limit=None))
            assert summary["done"] == n, summary
            with Store(home / "carl.db") as store:
                done = [
                    r[0]
                    for r in store.conn.execute(
                        "SELECT done_at FROM agent_tasks ORDER BY done_at DESC LIMIT ?", (n,)
                    )
                ][::-1]
            plane.append((done[-1] - done[0]) / (n - 1))
    return {
        "tasks": n,
        "direct_s_per_task": statistics.median(direct),
        "plane_s_per_task": statistics.median(plane),
        "rounds": rounds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--hops", type=int, default=2_000)
    parser.add_argument("--tasks", type=int, default=60)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    t = bench_throughput(args.events)
    print(
        f"1. publish -> stored row: {t['plane_per_s']:,.0f} events/s over {t['events']:,} events "
        f"({t['stored']:,} stored); baseline, the same writer with no bus: {t['direct_per_s']:,.0f}/s; "
        f"ratio {t['plane_per_s'] / t['direct_per_s']:.2f}; goal >= {GOAL_EVENTS_PER_S:,}/s "
        f"{'met' if t['plane_per_s'] >= GOAL_EVENTS_PER_S else 'NOT met'}"
    )
    print(
        f"   CPU per event: audit {t['audit_us']:.1f} us, publisher {t['publisher_us']:.1f} us, "
        f"nats-server {t['server_us']:.1f} us"
    )
    h = bench_hops(args.hops)
    print(
        f"2. bus hop (publish -> worker's fetch): p50 {h['jetstream_50']:.2f} ms, "
        f"p99 {h['jetstream_99']:.2f} ms; "
        f"baseline core NATS pub/sub: p50 {h['core_50']:.2f} ms, p99 {h['core_99']:.2f} ms; "
        f"ratio p99 {h['jetstream_99'] / h['core_99']:.1f}x; goal p99 <= {GOAL_HOP_P99_MS} ms "
        f"{'met' if h['jetstream_99'] <= GOAL_HOP_P99_MS else 'NOT met'}"
    )
    for kind, what in (
        ("model", "the tiny model on this CPU"),
        ("http", "a model server answering in 100 ms"),
    ):
        o = bench_overhead(args.tasks, kind=kind)
        overhead = o["plane_s_per_task"] / o["direct_s_per_task"] - 1
        print(
            f"3. per task, {what}: through the plane {o['plane_s_per_task'] * 1000:.1f} ms, the worker "
            f"called directly {o['direct_s_per_task'] * 1000:.1f} ms ({o['tasks']} demo tasks, "
            f"median of {o['rounds']} rounds "
            f"each); ratio {o['plane_s_per_task'] / o['direct_s_per_task']:.3f}, overhead {overhead:+.1%} "
            f"({(o['plane_s_per_task'] - o['direct_s_per_task']) * 1000:+.1f} ms a task); "
            f"goal <= {GOAL_OVERHEAD:.0%} "
            f"{'met' if overhead <= GOAL_OVERHEAD else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
