"""Hook payloads and NATS messages: what reaches the engine while it runs, never through a command a person
types.

- hooks: a session of Claude Code hook payloads (the shapes of docs/reference/agent-traces.md, as
  tests/test_trajectory_hooks.py builds them), mutated, each recorded by the real recorder into the spool, now
  and then with a damaged spool file beside them; then one tick of the engine's spool job (`ingest_spool`).
  The spool must be empty after it (each file stored, or moved aside with its reason), and no session may fail
  on an exception the assembly did not expect (its log line names it).
- nats: hostile messages published on the plane's subjects of a real nats-server (one for the family), stored
  by the engine's audit (the Bridge, in its thread, on the family's store), then one good task: it must be
  stored, every message must cost exactly one row, and the audit must still be up.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from hostile import values as hv
from hostile.oracle import HANG, OK, TRACEBACK, Outcome, carl_log, crash_in
from hostile.runner import Family, Workspace
from hostile.trajectory_families import list_trajectories

# -- hooks ---------------------------------------------------------------------------------------------------


def hook_session() -> list[dict[str, Any]]:
    from test_trajectory_hooks import (
        BASH,
        EDIT,
        READ,
        failure,
        post,
        pre,
        prompt,
        session_end,
        session_start,
        stop,
    )

    return [
        session_start(),
        prompt("add a health endpoint to the API"),
        pre("Read", READ),
        post("Read", READ, {"type": "text", "file": {"filePath": READ["file_path"]}}, duration_ms=12),
        post("Edit", EDIT, {"filePath": EDIT["file_path"], "structuredPatch": []}),
        failure("Bash", BASH, "Exit code 1\nFAILED tests/test_api.py::test_health\n1 failed"),
        stop(),
        prompt("no, that's wrong: the endpoint must be /healthz"),
        post("Bash", BASH, {"stdout": "1 passed", "stderr": "", "interrupted": False}),
        stop(),
        session_end(),
    ]


@dataclass
class HookCase:
    payloads: list[bytes]  # what Claude Code writes on the hook's stdin, one a call
    spool_files: list[bytes]  # spool files as a crash or a disk may leave them


@st.composite
def hook_cases(draw: st.DrawFn, seeds: Any) -> HookCase:
    session = hook_session()
    if draw(st.integers(0, 3)) == 0:  # one session id for all: the hostile one
        sid = draw(
            st.one_of(
                hv.hostile_text(), hv.hostile_number(), st.sampled_from(hv.SHAPE_ATOMS).map(copy.deepcopy)
            )
        )
        session = [{**payload, "session_id": sid} for payload in session]
    payloads = []
    for payload in session:
        if draw(st.integers(0, 2)) == 0:
            payloads.append(draw(hv.json_bytes(payload)))
        else:
            payloads.append(hv.dumps(payload, ascii_only=draw(st.booleans())))
    spooled = []
    for _ in range(draw(st.integers(0, 2))):
        wrapper = {"received_at": 1.7e9, "payload": draw(st.sampled_from(session))}
        spooled.append(draw(hv.json_bytes(wrapper)))
    return HookCase(payloads, spooled)


def feed_hooks(case: HookCase, ws: Workspace, where: Path) -> Outcome:
    from engine.store import Store
    from engine.trajectories.capture.hooks import spool_dir
    from engine.trajectories.capture.live import ingest_spool
    from engine.trajectories.capture.recorder import record
    from engine.trajectories.trajectory_settings import load

    errors_log = ws.home / "logs" / "hook-errors.log"
    logged_before = errors_log.stat().st_size if errors_log.exists() else 0
    for payload in case.payloads:
        record(payload, ws.home)
    folder = spool_dir(ws.home)
    folder.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(case.spool_files):
        (folder / f"{time.time_ns():020d}-1-{i}-bad{i:03d}.json").write_bytes(data)
    with carl_log() as log, Store(ws.db) as store:
        ingest_spool(store, ws.home, load(ws.home))
    left = sorted(p.name for p in folder.glob("*.json"))
    logged = errors_log.read_bytes()[logged_before:].decode("utf-8", "replace") if errors_log.exists() else ""
    failed = [line for line in logged.splitlines() if "hook failed" in line]
    if failed:
        return Outcome(TRACEBACK, f"the recorder raised: {failed[0]}")
    crash = crash_in(log.lines)
    if crash:
        return Outcome(TRACEBACK, f"swallowed: {crash}")
    if left:  # the next tick would read them again, and again
        for name in left:
            (folder / name).unlink()
        return Outcome(HANG, f"{len(left)} spool file(s) neither stored nor moved aside: {left[:3]}")
    return Outcome(OK)


# -- NATS ----------------------------------------------------------------------------------------------------


def event_seeds() -> list[tuple[str, dict[str, Any]]]:
    """(subject, payload) of every event kind the audit stores, made by the plane's own models."""
    from engine.agents.events import (
        FeedbackEvent,
        ManagerStatusEvent,
        ModelUpdateEvent,
        ResultEvent,
        TaskEvent,
        TrainingRolloutEvent,
        WorkerStatusEvent,
    )

    task = TaskEvent(manager_id="m", task_type="demo", prompt="What is 2+2?", reference="4", verifier="demo")
    events = [
        task,
        WorkerStatusEvent(
            worker_id="w1", kind="model", task_types=["demo"], state="busy", task_id=task.task_id
        ),
        ResultEvent(
            task_id=task.task_id,
            worker_id="w1",
            task_type="demo",
            status="success",
            result="<step>2+2</step><answer>4</answer>",
            steps=["2+2"],
            answer="4",
            token_logprobs=[-0.1, -0.2],
        ),
        FeedbackEvent(
            task_id=task.task_id, manager_id="m", worker_id="w1", score=0.9, dimensions={"quality": 0.8}
        ),
        TrainingRolloutEvent(
            task_id=task.task_id,
            worker_id="w1",
            task_type="demo",
            prompt="What is 2+2?",
            response="4",
            prm_score=0.9,
            outcome_score=1.0,
            reward=0.95,
            step_scores=[0.9],
        ),
        ModelUpdateEvent(model_version="v2", checkpoint_path="/tmp/adapter", base_model="tiny", step=3),
        ManagerStatusEvent(manager_id="m", state="assigning", total=4, assigned=1),
    ]
    return [(event.subject(), event.model_dump(mode="json")) for event in events]


MESSAGES = (
    8  # hostile messages a case publishes, on average (the audit writes every 0.25 s: a case waits once)
)
SUBJECTS = (
    "tasks.demo",
    "results.demo",
    "status.workers.w1",
    "status.manager",
    "feedback.scored",
    "training.rollouts",
    "model.updates",
    "alignment.alarms",
    "tasks.\u00e9",
    "results.x",
)


@dataclass
class NatsCase:
    messages: list[tuple[str, bytes]]


@st.composite
def nats_cases(draw: st.DrawFn, seeds: list[tuple[str, dict[str, Any]]]) -> NatsCase:
    messages = []
    for _ in range(draw(st.integers(1, 2 * MESSAGES - 1))):
        subject, payload = draw(st.sampled_from(seeds))
        if draw(st.integers(0, 4)) == 0:
            subject = draw(st.sampled_from(SUBJECTS))
        messages.append((subject, draw(hv.json_bytes(payload))))
    return NatsCase(messages)


# Reasons of a rejected row that name an exception the parser or the store did not expect. "cannot be stored:
# OverflowError" is the store refusing an integer past 64 bits, as the audit documents it
# (engine/agents/audit.py).
UNEXPECTED = ("unreadable:", "dead-lettered")


class Plane:
    """A nats-server, the engine's audit (Bridge) on the family's store, and a publishing connection, for the
    whole family; the publisher runs on its own event loop in a thread."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="hostile-nats")
        self.sent = 0

    def run(self, coroutine: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @contextlib.contextmanager
    def started(self) -> Iterator[Plane]:
        from agents_support import address_of, jetstream, nats_server

        from engine.agents.plane import Bridge
        from engine.agents.plane_settings import AgentsSettings

        self.thread.start()
        with nats_server(self.ws.root / "nats-home") as server:
            self.address = address_of(server)
            self.nc, self.js = self.run(jetstream(self.address))
            self.bridge = Bridge(self.ws.home, self.address, AgentsSettings())
            self.bridge.start()
            try:
                yield self
            finally:
                self.bridge.stop()
                with contextlib.suppress(Exception):
                    self.run(self.nc.close(), 10)
                self.loop.call_soon_threadsafe(self.loop.stop)

    def restart_bridge(self) -> None:
        """A new audit on a new home (after a hang, the workspace moved to a fresh home)."""
        from engine.agents.plane import Bridge
        from engine.agents.plane_settings import AgentsSettings

        self.bridge.stop()
        self.bridge = Bridge(self.ws.home, self.address, AgentsSettings())
        self.bridge.start()


def rows(ws: Workspace) -> tuple[list[tuple[str, str | None]], int, str]:
    """(status and reason of every row of the audit's log, the dead-lettered total, the newest reason)."""
    from engine.agents.audit import AUDIT_KEY

    conn = ws.baseline.connect()
    try:
        log = conn.execute("SELECT coalesce(status, 'ok'), reason FROM agent_events ORDER BY id").fetchall()
        kv = conn.execute("SELECT value FROM kv WHERE key=?", (AUDIT_KEY,)).fetchone()
    finally:
        conn.close()
    totals = json.loads(kv[0]) if kv else {}
    return log, int(totals.get("dead_letters") or 0), str(totals.get("last") or "")


def feed_nats(case: NatsCase, ws: Workspace, where: Path) -> Outcome:
    from engine.agents.bus import publish
    from engine.agents.events import TaskEvent

    plane: Plane = ws.context["plane"]
    if plane.bridge.home != ws.home:  # a hang moved the workspace to a fresh home
        plane.restart_bridge()
    log, dead_before, _ = rows(ws)
    before = len(log)
    sentinel = TaskEvent(manager_id="m", task_type="demo", prompt=f"sentinel {time.monotonic_ns()}")

    # What the server refuses to take (a payload past its max_payload) no client can send: left out.
    messages = [(subject, data) for subject, data in case.messages if len(data) < plane.nc.max_payload - 1024]

    async def send() -> None:
        for subject, data in messages:
            await plane.js.publish(subject, data)
        await publish(plane.js, sentinel)

    plane.run(send())
    expected = before + len(messages) + 1
    deadline = time.monotonic() + 15
    while True:
        stored, dead, last = rows(ws)
        if dead > dead_before:  # acknowledged, and stored nowhere: not even as a rejected row
            return Outcome(TRACEBACK, f"{dead - dead_before} message(s) dead-lettered: {last}")
        if len(stored) >= expected:
            break
        if time.monotonic() > deadline or not plane.bridge.alive():
            why = plane.bridge.error or plane.bridge.audit_trouble or "nothing"
            return Outcome(
                HANG, f"the audit stored {len(stored) - before} of {len(case.messages) + 1} ({why})"
            )
        time.sleep(0.01)
    new = stored[before:]
    if len(stored) > expected:
        return Outcome(TRACEBACK, f"{len(stored) - expected} message(s) stored twice")
    for status, reason in new:
        if status != "ok" and reason and reason.split(": ", 1)[-1].startswith(UNEXPECTED):
            return Outcome(TRACEBACK, f"rejected on an unexpected exception: {reason}")
    if plane.bridge.audit_trouble:
        return Outcome(HANG, f"the audit holds the stream back: {plane.bridge.audit_trouble}")
    reasons = [reason for status, reason in new if status != "ok" and reason]
    crash = crash_in(reasons, allowed=("OverflowError",))
    if crash:
        return Outcome(TRACEBACK, f"rejected on an unexpected exception: {crash}", inputs=len(messages))
    return Outcome(OK, inputs=max(len(messages), 1), refused=min(len(reasons), len(messages) - 1))


@contextlib.contextmanager
def nats_context(ws: Workspace) -> Iterator[None]:
    with Plane(ws).started() as plane:
        ws.context["plane"] = plane
        yield


FAMILIES = [
    Family(
        "hook-payloads", lambda folder: None, hook_cases, feed_hooks, ci_examples=40, after=list_trajectories
    ),
    Family(
        "nats-payloads",
        lambda folder: event_seeds(),
        nats_cases,
        feed_nats,
        ci_examples=12,
        inputs_per_case=MESSAGES,
        context=nats_context,
    ),
]
