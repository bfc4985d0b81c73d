"""The vocabulary of commands: every verb the `commands` queue carries, each defined once.

A verb (`Verb`) names who obeys it (a run's runner, the engine, or the agents plane through the engine) and
the arguments it takes, each with its check. `check` is run by every sender before a row is written
(`insert_command`: the control room's `CommandSender`, the CLIs, the demo, experiments) and by every receiver
on each row it claims (the runner's `CommandPump`, the engine's dispatcher), so a row written by hand or by an
older version meets the same refusal: one line naming what was wrong, with what is valid.

A `Verb` is the string it names, so a verb read from a row compares equal to its member.

Light on purpose: the control room imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from engine.errors import CarlError


class CommandError(CarlError):
    """A command the vocabulary refuses: an unknown verb, a bad argument, the wrong receiver. Its one line
    says what was wrong and what is valid."""


class Obeyer(StrEnum):
    """Who carries out a verb."""

    RUN = "run"  # the runner of its run: carl train, CarlCallback, the plane's trainer (CommandPump)
    ENGINE = "engine"  # the engine daemon (engine/daemon/loop.py)
    PLANE = "plane"  # the agents plane, handed the command by the engine (engine/agents/plane.py)

    @property
    def who(self) -> str:
        """It, in words: "a run", "the engine", "the agents plane"."""
        return {Obeyer.RUN: "a run", Obeyer.ENGINE: "the engine", Obeyer.PLANE: "the agents plane"}[self]

    @property
    def target(self) -> str:
        """The queue's `target` of its commands: a run's runner claims 'run' rows, the engine the rest."""
        return "run" if self is Obeyer.RUN else "engine"


@dataclass(frozen=True)
class Kind:
    """What a valid value of an argument is: said in words (for the refusal line), and tested."""

    what: str
    valid: Callable[[Any], bool]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def choice(*options: str) -> Kind:
    """One of `options`."""
    return Kind(" or ".join(options), lambda value: value in options)


POSITIVE = Kind("a number > 0", lambda value: _number(value) and value > 0)
NOT_NEGATIVE = Kind("a number >= 0", lambda value: _number(value) and value >= 0)
WHOLE_POSITIVE = Kind("a whole number > 0", lambda value: _whole(value) and value > 0)
WORKERS = Kind("a whole number from 0 to 64", lambda value: _whole(value) and 0 <= value <= 64)
TEXT = Kind("text, not empty", lambda value: isinstance(value, str) and value != "")
ANY_TEXT = Kind("text", lambda value: isinstance(value, str))
FLAG = Kind("true or false", lambda value: isinstance(value, bool))
PATHS = Kind(
    "a list of paths", lambda value: isinstance(value, list) and all(isinstance(v, str) for v in value)
)
SETTINGS = Kind("a table of settings", lambda value: isinstance(value, dict))
RUN_REF = Kind("a run's name or id", lambda value: TEXT.valid(value) or WHOLE_POSITIVE.valid(value))


@dataclass(frozen=True)
class Argument:
    """One argument of a verb. A value of null counts as not given."""

    name: str
    kind: Kind
    required: bool = False


class Verb(StrEnum):
    """Every command of the queue: its name (the member's value, stored in `commands.verb`), who obeys it, its
    arguments, and the arguments of which at least one must be given."""

    obeyer: Obeyer
    arguments: tuple[Argument, ...]
    needs_one_of: tuple[str, ...]

    def __new__(
        cls,
        name: str,
        obeyer: Obeyer,
        arguments: tuple[Argument, ...] = (),
        needs_one_of: tuple[str, ...] = (),
    ) -> Verb:
        member = str.__new__(cls, name)
        member._value_ = name
        member.obeyer = obeyer
        member.arguments = arguments
        member.needs_one_of = needs_one_of
        return member

    # A run's runner, at its next step boundary (engine/training/backend.py CommandPump).
    PAUSE = "pause", Obeyer.RUN
    RESUME = "resume", Obeyer.RUN
    STOP = "stop", Obeyer.RUN  # a checkpoint first
    CHECKPOINT = "checkpoint", Obeyer.RUN
    SET_LR = "set_lr", Obeyer.RUN, (Argument("lr", POSITIVE, required=True),)
    SET_WEIGHT = (
        "set_weight",
        Obeyer.RUN,
        (Argument("reward", TEXT, required=True), Argument("weight", NOT_NEGATIVE, required=True)),
    )
    # The engine (engine/daemon/loop.py start_command).
    OBSERVE = (
        "observe",
        Obeyer.ENGINE,
        (
            Argument("path", TEXT, required=True),  # a file, a run's folder or a directory of runs
            Argument("follow", FLAG),
            Argument("name", ANY_TEXT),
            Argument("logs", PATHS),  # the console of its runs
            Argument("pairing", choice("auto", "join", "separate")),
        ),
    )
    TRAIN = (
        "train",
        Obeyer.ENGINE,
        (
            Argument("config", TEXT),  # a carl.yaml path, or "demo"
            Argument("resume", RUN_REF),
            Argument("name", TEXT),
            Argument("max_steps", WHOLE_POSITIVE),
            Argument("backend", choice("auto", "torch", "mlx")),
        ),
        ("config", "resume"),
    )
    EVAL = "eval", Obeyer.ENGINE, (Argument("run", RUN_REF, required=True),)
    # The agents plane (engine/agents/plane.py Plane.command); `origin` says who asked, in its control events.
    AGENTS_UP = (
        "agents_up",
        Obeyer.PLANE,
        (
            Argument("workers", WORKERS),
            Argument("tasks", TEXT),  # "demo" or a JSONL path
            Argument("train", FLAG),
            Argument("limit", WHOLE_POSITIVE),
            Argument("config", TEXT),  # an agents.yaml path
            Argument("overrides", SETTINGS),
            Argument("until_run", TEXT),  # the plane stops when that run ends
            Argument("serve_run", TEXT),  # the run whose checkpoints the workers serve
        ),
    )
    AGENTS_DOWN = "agents_down", Obeyer.PLANE
    AGENTS_PAUSE = "agents_pause", Obeyer.PLANE, (Argument("origin", TEXT),)
    AGENTS_RESUME = "agents_resume", Obeyer.PLANE, (Argument("origin", TEXT),)
    AGENTS_ADD_WORKER = "agents_add_worker", Obeyer.PLANE
    AGENTS_STOP_WORKER = (
        "agents_stop_worker",
        Obeyer.PLANE,
        (Argument("worker_id", TEXT, required=True), Argument("origin", TEXT)),
    )

    def takes(self) -> str:
        """`set_weight takes reward, weight`: the verb's arguments, for a refusal line."""
        names = ", ".join(argument.name for argument in self.arguments)
        return f"{self.value} takes {names}" if names else f"{self.value} takes no arguments"


def obeyed_by(*obeyers: Obeyer) -> tuple[Verb, ...]:
    """The verbs these obey, in the vocabulary's order."""
    return tuple(verb for verb in Verb if verb.obeyer in obeyers)


def _shown(value: Any) -> str:
    """A value from a row, for a refusal line: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def verb_of(name: Any, *obeyers: Obeyer, what: str = "command") -> Verb:
    """The verb `name` names, among those `obeyers` obey (every verb when none is named). CommandError, e.g.
    "unknown command 'warp' (known: pause, resume, ...)"; `what` is the word for a command there."""
    known = obeyed_by(*obeyers) if obeyers else tuple(Verb)
    verb = next((verb for verb in known if verb.value == name), None)
    if verb is None:
        raise CommandError(f"unknown {what} {_shown(name)} (known: {', '.join(known)})")
    return verb


def check(
    verb: str,
    args: Mapping[str, Any] | None = None,
    *,
    target: str | None = None,
    run_id: int | None = None,
) -> dict[str, Any]:
    """The arguments of a command, checked against its verb's definition: returned as given (a new dict), or
    CommandError with one line naming the verb or the argument that is wrong and what is valid. With `target`
    (a row's receiver), it must be the verb's, and a run's command must name its run."""
    known = verb_of(verb)
    if target is not None and target != known.obeyer.target:
        raise CommandError(
            f"{known}: obeyed by {known.obeyer.who}, so sent to {known.obeyer.target!r}, not {_shown(target)}"
        )
    if target is not None and known.obeyer is Obeyer.RUN and run_id is None:
        raise CommandError(f"{known}: obeyed by a run, and no run is named")
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise CommandError(f"{known}: its arguments must be a table of names and values, got {_shown(args)}")
    defined = {argument.name: argument for argument in known.arguments}
    for name in args:
        if name not in defined:
            raise CommandError(f"{known}: no argument {_shown(name)} ({known.takes()})")
    for argument in known.arguments:
        value = args.get(argument.name)
        if value is None:
            if argument.required:
                raise CommandError(f"{known}: {argument.name} is missing ({known.takes()})")
        elif not argument.kind.valid(value):
            raise CommandError(f"{known}: {argument.name} must be {argument.kind.what}, got {_shown(value)}")
    if known.needs_one_of and all(args.get(name) is None for name in known.needs_one_of):
        raise CommandError(f"{known}: needs {' or '.join(known.needs_one_of)} ({known.takes()})")
    return dict(args)
