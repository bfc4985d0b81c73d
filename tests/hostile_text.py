"""A store whose every stored string is hostile to a terminal (issue 22 §5), for the sweeps of
tests/test_hostile_terminal.py: run names, metric and reward keys, prompts, completions, events, health
reasons, trajectories, agent events, chat messages and command results hold ESC and CSI sequences, OSC (a
title, and OSC 52, which sets the clipboard), C1 CSI, CR, BS, DEL, Textual/Rich markup and a lone
surrogate (made storable first, as every edge does: engine/text.py)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from engine.store import Store
from engine.text import storable

CLEAR = "\x1b[2J\x1b[H"  # clear the screen, cursor home
TITLE = "\x1b]0;pwned\x07"  # rewrite the window (pane) title
CLIPBOARD = "\x1b]52;c;aGVsbG8=\x07"  # OSC 52: set the clipboard
C1_CSI = "\x9b2J"  # the one-byte CSI: clear the screen
OVERSTRIKE = "ok\rNO\b\b"  # CR and BS rewrite what was printed
DEL = "\x7f"
LINK = "x[link=http://127.0.0.1/]y"  # markup that made a link (and, in a run name, killed the app)
MARKUP = "[b]bold[/b][/]"  # a closing tag with nothing open raises MarkupError
SURROGATE = "s\ud800"
# Issue 30 §9: text that moves a border without a control byte: a bidi override (`rtl\u202egpj.exe` prints as
# "rtlexe.jpg"), an isolate, zero-width characters, an emoji glued by ZWJs, a run of combining marks.
BIDI = "rtl\u202egpj.exe\u2066iso\u2069"
ZERO_WIDTH = "a\u200bb\ufeffc\u2060d"
ZWJ = "\U0001f468\u200d\U0001f469\u200d\U0001f467\u2764\ufe0f"
ZALGO = "Z" + "\u0301\u0302\u0303\u0304\u0305\u0306\u0307\u0308" * 3

# Every shape in one string, and a short one for names that must fit a column.
HOSTILE = f"{CLEAR}{TITLE}{CLIPBOARD}{C1_CSI}{OVERSTRIKE}{DEL}{LINK}{MARKUP}{SURROGATE}" + (
    f"{BIDI}{ZERO_WIDTH}{ZWJ}{ZALGO}"
)
SHORT = f"r\x1b]52;c;aGk=\x07{C1_CSI}\r\b{LINK}[/]"

# A raw control byte on a screen line or in printed output: anything a terminal obeys (C0 but \n and
# \t, DEL, C1), a format character or variation selector, or a third combining mark on one character. Their
# visible forms (`\x1b`, `\x9b`, `\r`, `\u202e`) are plain text and pass.
RAW_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f"
    "\ufe00-\ufe0f\ufeff]|[\u0300-\u036f]{3}"
)


def hostile(label: str) -> str:
    """A storable hostile string that still says what it is (so a test can find where it shows)."""
    return storable(f"{label}{HOSTILE}")


def fill(home: Path) -> dict[str, int | str]:
    """A store in `home` with one hostile run (metrics, rewards, samples, rollouts, events, a failed command),
    a hostile experiment, trajectories, agent events and a chat. Returns the ids a test needs."""
    from engine.agents.audit import AuditWriter, Incoming
    from engine.agents.events import AlarmEvent, FeedbackEvent, ResultEvent, TaskEvent, WorkerStatusEvent
    from engine.trajectories.store import save
    from engine.trajectories.trajectory import Event, Trajectory

    now = time.time()
    with Store(home / "carl.db") as store:
        plain = store.create_run("plain", source_kind="jsonl", vocab_size=512)
        store.add_metrics(plain, [(s, "phi/mean", 0.5, now) for s in range(5)])
        # a carl run (its keys send commands): the stop dialog and the weight dialog quote its names
        run_id = store.create_run(storable(SHORT), source_kind="carl", vocab_size=512, max_steps=20)
        # The store makes a new name printable (engine/names.py as_name); a store written before it did holds
        # the name as it came, and that is what every view must still show as text.
        with store.transaction():
            store.conn.execute("UPDATE runs SET name=? WHERE id=?", (storable(SHORT), run_id))
        key = storable(f"rewards/{SHORT}/mean")
        rows = []
        for s in range(10):
            rows += [
                (s, "phi/mean", 0.5 + s / 40, now),
                (s, "phi/entropy", 1.0, now),
                (s, "reward", 0.5, now),
                (s, key, 0.25, now),
                (s, storable(f"custom/{SHORT}"), float(s), now),
            ]
        store.add_metrics(run_id, rows)
        store.update_run(
            run_id,
            phase=storable(SHORT),
            health="yellow",
            health_reasons=[hostile("reason")],
            error=hostile("error"),
            framework=storable(SHORT),
            model=hostile("model"),
        )
        store.add_event(run_id, 3, storable(SHORT), hostile("event"))
        source = store.upsert_source("jsonl", hostile("/tmp/source"), name=storable(SHORT), follow=True)
        store.save_source_progress(source, {}, error=hostile("source error"))
        sample = {
            "step": 9,
            "idx": 0,
            "kind": "best",
            "prompt": hostile("prompt"),
            "completion": hostile("completion"),
            "tokens": [storable(SHORT), "\x1b[2J", "\r", "ok"],
            "phi": [0.5, 0.6, 0.7, 0.8],
            "entropy": [1.0, 1.0, 1.0, 1.0],
            "rewards": {storable(SHORT): 0.5},
        }
        store.add_samples(run_id, [sample])
        store.add_rollouts(
            run_id,
            [
                {
                    "step": 9,
                    "idx": i,
                    "group_id": storable(SHORT),
                    "prompt": hostile("prompt"),
                    "completion": hostile("completion"),
                    "rewards": {storable(SHORT): 0.5},
                    "tokens": [storable(SHORT), "\x1b[2J", "\r", "ok"],
                    "entropy": [1.0, 1.0, 1.0, 1.0],
                    "extra": {storable(SHORT): hostile("extra")},
                }
                for i in range(2)
            ],
        )
        store.set_key_names(run_id, {key: storable(SHORT)})
        command = store.enqueue_command("checkpoint", {}, target="run", run_id=run_id)
        store.finish_command(command, False, hostile("result"))
        experiment = store.create_experiment(
            storable(SHORT), {"name": hostile("cfg")}, [storable(SHORT)], [1], steps=5, warmup_steps=0
        )
        conversation, _ = store.add_chat_message(None, run_id, "user", hostile("question"))
        store.add_chat_message(conversation, run_id, "assistant", hostile("answer"))
        trajectories = [
            Trajectory(
                uid=f"hostile-{i}",
                session_id=hostile("session"),
                agent="claude-code",
                source=hostile("source"),
                prompt=hostile("prompt"),
                cwd=hostile("cwd"),
                started_at=now - 60,
                ended_at=now,
                events=[
                    Event(
                        tool=storable(SHORT), success=False, exit_code=1, params={"command": hostile("cmd")}
                    ),
                    Event(tool="Bash", success=True, params={"file_path": hostile("path")}),
                ],
            )
            for i in range(2)
        ]
        save(store, trajectories)
        writer = AuditWriter(store)
        task = TaskEvent(manager_id="manager", task_type="demo", prompt=hostile("task"), reference=SHORT)
        events = [
            WorkerStatusEvent(
                worker_id="w-1", kind="model", task_types=["demo"], model=hostile("m"), state="idle"
            ),
            task,
            ResultEvent(
                task_id=task.task_id,
                worker_id="w-1",
                task_type="demo",
                prompt=hostile("task"),
                status="failed",
                result=hostile("result"),
                steps=[hostile("step")],
                answer=hostile("answer"),
                error=hostile("why"),
            ),
            FeedbackEvent(
                task_id=task.task_id,
                manager_id="manager",
                worker_id="w-1",
                score=0.5,
                textual_feedback=hostile("feedback"),
            ),
            AlarmEvent(kind="collusion", reason=hostile("alarm"), worker_id="w-1"),
        ]
        batch = [Incoming(e.subject(), e.encode(), i + 1, f"hostile:{i}") for i, e in enumerate(events)]
        batch.append(Incoming("results.demo", json.dumps({"type": hostile("x")}).encode(), 99, "hostile:99"))
        writer.write(batch)
    return {"run_id": run_id, "experiment_id": experiment, "task_id": task.task_id}
