"""One vocabulary of commands (engine/store/commands.py): an unknown verb or a bad argument is refused at the
sender with one line that says what is valid, every writer of command rows goes through it, and the receivers
(the runner's pump, the engine's dispatcher) refuse a row written past it with the same line."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from engine.store import Store
from engine.store.commands import CommandError, Obeyer, Verb, check, obeyed_by, verb_of
from engine.training.backend import CommandPump, Reporter

ALL = ", ".join(verb.value for verb in Verb)


def command_row(store: Store, verb: str, args: Any, *, target: str, run_id: int | None = None) -> int:
    """A command row written past the vocabulary (by hand, or by an older carl): what a receiver must refuse
    itself."""
    with store.transaction():
        cur = store.conn.execute(
            "INSERT INTO commands (target, run_id, verb, args, state, origin, created_at)"
            " VALUES (?,?,?,?, 'pending', 'test', ?)",
            (target, run_id, verb, json.dumps(args), time.time()),
        )
    return int(cur.lastrowid or 0)


def refusal(verb: Any, args: Any = None, **where: Any) -> str:
    with pytest.raises(CommandError) as refused:
        check(verb, args, **where)
    line = str(refused.value)
    assert "\n" not in line
    return line


def test_an_unknown_verb_is_one_line_listing_the_valid_ones() -> None:
    assert refusal("warp") == f"unknown command 'warp' (known: {ALL})"
    assert refusal("x" * 500) == f"unknown command '{'x' * 58}… (known: {ALL})"  # a long name is cut short
    assert refusal(None).startswith("unknown command None (known: pause, ")
    with pytest.raises(
        CommandError, match=r"^unknown command 'train' \(known: pause, resume, stop, checkpoint, "
    ):
        verb_of("train", Obeyer.RUN)  # the runner knows only a run's verbs
    line = (
        "unknown engine command 'pause' (known: observe, train, eval, agents_up, agents_down, agents_pause,"
    )
    with pytest.raises(CommandError, match=f"^{re.escape(line)}"):
        verb_of("pause", Obeyer.ENGINE, Obeyer.PLANE, what="engine command")


def test_a_bad_argument_is_one_line_naming_it() -> None:
    assert refusal("set_lr", {"lr": -1}) == "set_lr: lr must be a number > 0, got -1"
    assert refusal("set_lr", {"lr": float("nan")}) == "set_lr: lr must be a number > 0, got nan"
    assert refusal("set_lr", {"lr": True}) == "set_lr: lr must be a number > 0, got True"
    assert refusal("set_lr", {}) == "set_lr: lr is missing (set_lr takes lr)"
    assert refusal("set_lr", {"lr": 1e-4, "rate": 2}) == "set_lr: no argument 'rate' (set_lr takes lr)"
    assert refusal("pause", {"now": True}) == "pause: no argument 'now' (pause takes no arguments)"
    assert refusal("set_weight", {"reward": "format", "weight": -0.5}) == (
        "set_weight: weight must be a number >= 0, got -0.5"
    )
    assert refusal("observe", [1]) == "observe: its arguments must be a table of names and values, got [1]"
    assert refusal("observe", {"path": "/x", "pairing": "both"}) == (
        "observe: pairing must be auto or join or separate, got 'both'"
    )
    assert refusal("train", {"name": "x"}) == (
        "train: needs config or resume (train takes config, resume, name, max_steps, backend)"
    )
    assert refusal("train", {"config": "demo", "backend": "jax"}) == (
        "train: backend must be auto or torch or mlx, got 'jax'"
    )
    assert (
        refusal("agents_up", {"workers": 65})
        == "agents_up: workers must be a whole number from 0 to 64, got 65"
    )
    assert (
        refusal("agents_stop_worker", {})
        == "agents_stop_worker: worker_id is missing (agents_stop_worker takes worker_id, origin)"
    )


def test_valid_arguments_come_back_as_given() -> None:
    args = {"path": "/runs/a", "follow": True, "name": None, "logs": ["/runs/a.log"]}  # null: not given
    assert check(Verb.OBSERVE, args) == args and check(Verb.OBSERVE, args) is not args
    assert check("pause") == {} and check("pause", {}) == {}
    assert check("train", {"resume": "grpo-1"}) == {"resume": "grpo-1"}
    assert check("eval", {"run": 3}) == {"run": 3}
    spec = {"workers": 2, "tasks": "demo", "train": False, "limit": None, "config": None, "overrides": {}}
    assert check(Verb.AGENTS_UP, spec) == spec


def test_a_command_goes_to_who_obeys_it() -> None:
    assert (
        refusal("pause", target="engine", run_id=1)
        == "pause: obeyed by a run, so sent to 'run', not 'engine'"
    )
    assert refusal("pause", target="run") == "pause: obeyed by a run, and no run is named"
    assert refusal("agents_down", target="run", run_id=1) == (
        "agents_down: obeyed by the agents plane, so sent to 'engine', not 'run'"
    )
    assert check("pause", target="run", run_id=1) == {} and check(
        "observe", {"path": "/x"}, target="engine"
    ) == {"path": "/x"}
    assert {verb.obeyer.target for verb in obeyed_by(Obeyer.ENGINE, Obeyer.PLANE)} == {"engine"}


def test_every_writer_of_command_rows_is_checked(tmp_path: Path) -> None:
    with Store(tmp_path / "carl.db") as store:
        run_id = store.create_run("r", source_kind="carl")
        with pytest.raises(CommandError, match=r"^unknown command 'warp'"):
            store.enqueue_command("warp", {}, target="run", run_id=run_id)
        with pytest.raises(CommandError, match=r"^set_lr: lr must be a number > 0, got 0$"):
            store.enqueue_command(Verb.SET_LR, {"lr": 0}, target="run", run_id=run_id)
        assert store.conn.execute("SELECT count(*) FROM commands").fetchone()[0] == 0
        queued = store.enqueue_command(Verb.SET_LR, {"lr": 1e-4}, target="run", run_id=run_id)
        assert store.conn.execute("SELECT verb, args FROM commands WHERE id=?", (queued,)).fetchone() == (
            "set_lr",
            '{"lr": 0.0001}',
        )


class RecordedControls:
    """A backend's loop, as the pump sees it: what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Any]] = []

    def request_save(self) -> None:
        self.asked.append(("save", None))

    def request_stop(self) -> None:
        self.asked.append(("stop", None))

    def set_lr(self, lr: float) -> None:
        self.asked.append(("lr", lr))

    def set_weight(self, reward: str, weight: float) -> str:
        self.asked.append(("weight", (reward, weight)))
        return f"weight of {reward} = {weight:g}"


def test_the_runner_refuses_a_row_past_the_vocabulary_with_its_line(tmp_path: Path) -> None:
    with Store(tmp_path / "carl.db") as store:
        run_id = store.create_run("r", source_kind="carl")
        pump = CommandPump(store, run_id, Reporter(store, run_id))
        assert set(pump._handlers()) == set(obeyed_by(Obeyer.RUN))  # every verb a run obeys has its handler
        rows = [
            command_row(store, "warp", {}, target="run", run_id=run_id),
            command_row(store, "set_lr", {"lr": -1}, target="run", run_id=run_id),
            command_row(store, "set_weight", {"reward": "format"}, target="run", run_id=run_id),
            command_row(store, "observe", {"path": "/x"}, target="run", run_id=run_id),
            command_row(store, "set_lr", {"lr": 2e-5}, target="run", run_id=run_id),
            command_row(store, "set_weight", {"reward": "format", "weight": 1}, target="run", run_id=run_id),
        ]
        controls = RecordedControls()
        pump.poll(7, controls)
        outcomes = [
            store.conn.execute("SELECT state, result FROM commands WHERE id=?", (row,)).fetchone()
            for row in rows
        ]
    run_verbs = "pause, resume, stop, checkpoint, set_lr, set_weight"
    assert outcomes == [
        ("failed", f"unknown command 'warp' (known: {run_verbs})"),
        ("failed", "set_lr: lr must be a number > 0, got -1"),
        ("failed", "set_weight: weight is missing (set_weight takes reward, weight)"),
        ("failed", f"unknown command 'observe' (known: {run_verbs})"),
        ("done", "learning rate 2e-05 from step 8"),
        ("done", "weight of format = 1"),
    ]
    assert controls.asked == [("lr", 2e-5), ("weight", ("format", 1.0))]
