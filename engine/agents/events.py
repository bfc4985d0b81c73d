"""Every event of the agents plane, as pydantic v2 models, and the subjects they travel on.

After Tentalis (docs/reference/agents-plane.md §2-3), with the project's rules (§12): each payload names
itself with a fixed `type` and a `schema_version`, unknown fields are refused (`extra="forbid"`), the
environment travels on the task, the result and the rollout, and scores are checked to lie in
[0, 1] on the wire (the scorer clamps before it publishes). `parse_event` turns bytes from a
subject into an event or an `EventRejected` whose message says what was wrong, in one line.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_serializer,
)

from engine.text import encodable, storable

SCHEMA_VERSION: Final = 1  # Final: its type is Literal[1], what `schema_version` accepts
TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # one NATS subject token: no dots, spaces or wildcards

Score = Annotated[float, Field(ge=0.0, le=1.0)]
MANAGER_TARGET = "manager"  # a model update's target_worker_id for the manager's own model
HINT_CHARS = 2000  # a hint is a sentence or two; longer is refused on the wire


def _one_token(value: str) -> str:
    if not TOKEN.match(value):
        raise ValueError("must be one subject token (letters, digits, _ or -, at most 64)")
    return value


SubjectToken = Annotated[str, AfterValidator(_one_token)]


def new_id() -> str:
    return str(uuid.uuid4())


def utc_now() -> datetime:
    return datetime.now(UTC)


class PlaneEvent(BaseModel):
    """What every event carries: its type, the schema version and when it was made (UTC, ISO-8601 Z)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    TYPE: ClassVar[str] = ""
    SUBJECT: ClassVar[str] = ""  # e.g. "tasks.{task_type}"

    schema_version: Literal[1] = SCHEMA_VERSION
    created_at: datetime = Field(default_factory=utc_now)

    @field_serializer("created_at")
    def _iso_z(self, value: datetime) -> str:
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def subject(self) -> str:
        """The subject this event travels on: its SUBJECT, filled in from its fields."""
        return self.SUBJECT.format_map(self.__dict__)

    def dedup_id(self) -> str:
        """The `Nats-Msg-Id` of this event: a repeat within the stream's window is stored once."""
        return f"{self.TYPE}-{uuid.uuid4()}"

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


class TaskEvent(PlaneEvent):
    TYPE: ClassVar[str] = "task"
    SUBJECT: ClassVar[str] = "tasks.{task_type}"
    type: Literal["task"] = "task"
    task_id: str = Field(default_factory=new_id)
    manager_id: str
    task_type: SubjectToken
    environment: SubjectToken = "chat"
    prompt: str
    reference: str | None = None  # what the task's verifier compares the answer with
    verifier: str | None = None  # the verifier's name ("demo", "reference"); None: the task has none
    group_id: str | None = None  # tasks of one GRPO group share it (the same prompt, asked several times)
    group_size: int = Field(1, ge=1)  # how many tasks the group has
    metadata: dict[str, Any] = Field(default_factory=dict)

    def dedup_id(self) -> str:
        return f"task-{self.task_id}"


class ResultEvent(PlaneEvent):
    TYPE: ClassVar[str] = "result"
    SUBJECT: ClassVar[str] = "results.{task_type}"
    type: Literal["result"] = "result"
    task_id: str
    worker_id: str
    task_type: SubjectToken
    environment: SubjectToken = "chat"
    prompt: str = ""
    status: Literal["success", "failed"]
    result: str  # the whole reply, in the <step>/<answer> format; on failure the reason
    steps: list[str] = Field(default_factory=list)
    answer: str = ""
    error: str | None = None  # why the work failed (status "failed")
    elapsed_seconds: float = Field(0.0, ge=0.0)
    model_version: str | None = None  # the version the worker served when it answered
    worker_kind: str = ""
    # The behaviour policy, per generated token: what the trainer's importance ratio is taken against.
    prompt_token_ids: list[int] = Field(default_factory=list)
    response_token_ids: list[int] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    temperature: float | None = None
    phi_mean: Score | None = None  # mean Phi of the answer's tokens, from the distributions that chose them
    metadata: dict[str, Any] = Field(default_factory=dict)  # environment signals: exit codes, tests, diff

    def dedup_id(self) -> str:
        return f"result-{self.task_id}"  # a redelivered task answered twice is stored once


class FeedbackEvent(PlaneEvent):
    """The manager's own judgement of a result, kept apart from the PRM step scores
    (docs/reference/agents-plane.md §12 rule 4)."""

    TYPE: ClassVar[str] = "feedback"
    SUBJECT: ClassVar[str] = "feedback.scored"
    type: Literal["feedback"] = "feedback"
    task_id: str
    manager_id: str
    worker_id: str
    score: Score
    textual_feedback: str = ""
    source: Literal["claude", "offline"] = "offline"
    dimensions: dict[str, Score] = Field(default_factory=dict)  # correctness, completeness, quality

    def dedup_id(self) -> str:
        return f"feedback-{self.task_id}"


class TrainingRolloutEvent(PlaneEvent):
    TYPE: ClassVar[str] = "rollout"
    SUBJECT: ClassVar[str] = "training.rollouts"
    type: Literal["rollout"] = "rollout"
    task_id: str
    worker_id: str
    task_type: SubjectToken
    environment: SubjectToken = "chat"
    group_id: str | None = None
    group_size: int = Field(1, ge=1)
    prompt: str
    response: str
    steps: list[str] = Field(default_factory=list)
    step_scores: list[Score] = Field(default_factory=list)  # PRM per step, clamped to [0, 1]
    prm_score: Score  # the PRM's score of the whole result (mean of its steps)
    outcome_score: Score  # the environment profile's combined score
    profile: str = ""  # the profile that scored it: the environment's, or chat when its own had no evidence
    dimensions: dict[str, Score] = Field(default_factory=dict)  # those that had evidence, each averaged
    verifier_score: Score | None = None  # the task's own verifier, where it has one
    reward: Score  # what the trainer optimises (see engine.agents.scoring.reward_of)
    model_version: str | None = None
    prompt_token_ids: list[int] = Field(default_factory=list)
    response_token_ids: list[int] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)  # the behaviour policy's, per response token
    temperature: float | None = None
    hint: str = Field("", max_length=HINT_CHARS)  # the manager's hint for it ("": none), the OPD teacher's
    # context (engine/training/opd.py); the same text went out on `opd.hints`

    def dedup_id(self) -> str:
        return f"rollout-{self.task_id}"


class ManagerRolloutEvent(TrainingRolloutEvent):
    """A hint the manager's own model wrote, as a rollout of that model: prompt = what it was asked, response
    = the hint, reward = its judged help mapped to [0, 1] ((help + 1) / 2). `task_id` and `worker_id` are the
    hinted result's; `group_id` its task group's (the hints written for one group of worker attempts)."""

    TYPE: ClassVar[str] = "manager_rollout"
    SUBJECT: ClassVar[str] = "training.manager"
    type: Literal["manager_rollout"] = "manager_rollout"  # type: ignore[assignment]

    def dedup_id(self) -> str:
        return f"manager-rollout-{self.task_id}"


HintSource = Literal["verifier", "error", "feedback", "claude", "manager_model"]


class HintEvent(PlaneEvent):
    """A short corrective instruction for one result, made from its directive signal (the verifier's
    failure, the tool's error, the manager's advice): the OPD teacher's extra context
    (docs/reference/agents-plane.md §14)."""

    TYPE: ClassVar[str] = "hint"
    SUBJECT: ClassVar[str] = "opd.hints"
    type: Literal["hint"] = "hint"
    task_id: str
    manager_id: str
    worker_id: str
    group_id: str | None = None
    hint: str = Field(min_length=1, max_length=HINT_CHARS)
    source: HintSource
    signal: str = Field("", max_length=HINT_CHARS)  # the message the hint was made from
    manager_version: str | None = None  # the trained manager's weights that wrote it (source manager_model)

    def dedup_id(self) -> str:
        return f"hint-{self.task_id}"


JudgedKind = Literal["agreement", "hint_help"]


class ManagerJudgedEvent(PlaneEvent):
    """The manager judged against what happened (docs/guide/agents.md): `agreement` = 1 − |feedback −
    verifier| for one result; `hint_help` = the verifier's score of the next attempt at a similar task
    (`next_task_id`) minus this hinted attempt's, in [-1, 1]."""

    TYPE: ClassVar[str] = "judged"
    SUBJECT: ClassVar[str] = "opd.judged"
    type: Literal["judged"] = "judged"
    task_id: str
    manager_id: str
    worker_id: str
    kind: JudgedKind
    value: float = Field(ge=-1.0, le=1.0)
    next_task_id: str | None = None

    def dedup_id(self) -> str:
        return f"judged-{self.kind}-{self.task_id}"


WeightsKind = Literal["adapter", "full"]
DIGEST = re.compile(r"^SHA-256=[A-Za-z0-9_-]{43}=?$")  # nats' object store digest: base64url of a sha256


def _digest(value: str | None) -> str | None:
    if value is not None and not DIGEST.match(value):
        raise ValueError("must be SHA-256=<base64url of 32 bytes>, as the object store writes it")
    return value


class ModelUpdateEvent(PlaneEvent):
    """New weights to serve: `model_version` is also their name, the one the worker loads and reports.

    The weights travel in the plane's object store (`bucket`, `object_name`, `digest`): a worker on any
    machine fetches them by name, checks the digest and swaps them in. `checkpoint_path` is where the
    publisher wrote them, used only when the update names no object (a publisher on the workers' disk).
    """

    TYPE: ClassVar[str] = "model_update"
    SUBJECT: ClassVar[str] = "model.updates"
    type: Literal["model_update"] = "model_update"
    model_version: str
    checkpoint_path: str  # a peft adapter directory, or a full model's (weights "full")
    base_model: (
        str  # the served model the weights were trained from (docs/reference/agents-plane.md §12 rule 6)
    )
    base_fingerprint: str = ""  # hash of the base model's config.json; a worker on another base refuses it
    target_worker_id: str | None = None  # None: every worker
    step: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)
    run: str = ""  # the run these weights come from ("" when unknown)
    weights: WeightsKind = "adapter"  # a peft LoRA adapter of the base, or every weight of the model
    bucket: str | None = None  # the JetStream object store bucket holding the weights (a tar archive)
    object_name: str | None = None
    digest: Annotated[str | None, AfterValidator(_digest)] = None
    size: int | None = Field(None, ge=0)  # bytes of the archive

    def subject(self) -> str:
        """The workers' weights on `model.updates`; the manager's own (engine/agents/manager_model.py) on
        `model.manager`, so a worker's look at the newest update never finds the manager's."""
        return "model.manager" if self.target_worker_id == MANAGER_TARGET else "model.updates"

    def dedup_id(self) -> str:
        return f"model-{self.model_version}"


AlarmKind = Literal["collusion", "reward_hacking", "worker_divergence", "stuck_worker"]


class AlarmEvent(PlaneEvent):
    TYPE: ClassVar[str] = "alarm"
    SUBJECT: ClassVar[str] = "alignment.alarms"
    type: Literal["alarm"] = "alarm"
    alarm_id: str = Field(default_factory=new_id)
    kind: AlarmKind
    reason: str
    worker_id: str | None = None
    task_id: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)

    def dedup_id(self) -> str:
        return f"alarm-{self.alarm_id}"


ControlAction = Literal["pause_assignment", "resume_assignment", "stop_worker", "shutdown"]


class ControlEvent(PlaneEvent):
    """A control action on the plane; `command_id` ties it to the store's command queue (the audit)."""

    TYPE: ClassVar[str] = "control"
    type: Literal["control"] = "control"
    control_id: str = Field(default_factory=new_id)
    action: ControlAction
    target: str = "manager"  # "manager", "workers" (all of them) or a worker id
    origin: str = "cli"
    command_id: int | None = None
    reason: str = ""

    def subject(self) -> str:
        if self.target in ("manager", "workers"):
            return f"control.{self.target}"
        return f"control.workers.{self.target}"

    def dedup_id(self) -> str:
        return f"control-{self.control_id}"


class WorkerStatusEvent(PlaneEvent):
    TYPE: ClassVar[str] = "worker_status"
    SUBJECT: ClassVar[str] = "status.workers.{worker_id}"
    type: Literal["worker_status"] = "worker_status"
    worker_id: SubjectToken
    kind: str  # model | http
    task_types: list[str]
    model: str = ""
    model_version: str | None = None
    state: Literal["starting", "idle", "busy", "stopping", "stopped", "error"]
    task_id: str | None = None  # the task it is working on (state busy)
    tasks_done: int = Field(0, ge=0)
    failures: int = Field(0, ge=0)
    host: str = ""
    pid: int | None = None
    detail: str = ""
    command_id: int | None = None  # the control room command this status answers


class ManagerStatusEvent(PlaneEvent):
    TYPE: ClassVar[str] = "manager_status"
    SUBJECT: ClassVar[str] = "status.manager"
    type: Literal["manager_status"] = "manager_status"
    manager_id: str
    state: Literal["assigning", "paused", "done", "stopped"]
    total: int | None = None  # tasks it will assign (None: it cycles through them until stopped)
    assigned: int = 0
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    timed_out: int = 0
    feedback: str = "offline"  # who writes the feedback: offline or claude
    detail: str = ""
    command_id: int | None = None  # the control room command this status answers


EVENT_TYPES: dict[str, type[PlaneEvent]] = {
    cls.TYPE: cls
    for cls in (
        TaskEvent,
        ResultEvent,
        FeedbackEvent,
        TrainingRolloutEvent,
        ModelUpdateEvent,
        AlarmEvent,
        ControlEvent,
        WorkerStatusEvent,
        ManagerStatusEvent,
        HintEvent,
        ManagerJudgedEvent,
        ManagerRolloutEvent,
    )
}

# The first subject token decides which type a message must be (the stream holds exactly these).
SUBJECT_TYPES: dict[str, tuple[str, ...]] = {
    "tasks": ("task",),
    "results": ("result",),
    "feedback": ("feedback",),
    "training": ("rollout", "manager_rollout"),
    "model": ("model_update",),
    "alignment": ("alarm",),
    "control": ("control",),
    "status": ("worker_status", "manager_status"),
    "opd": ("hint", "judged"),
}
STREAM_SUBJECTS = [f"{prefix}.>" for prefix in SUBJECT_TYPES]

Event = (
    TaskEvent
    | ResultEvent
    | FeedbackEvent
    | TrainingRolloutEvent
    | ModelUpdateEvent
    | AlarmEvent
    | ControlEvent
    | WorkerStatusEvent
    | ManagerStatusEvent
    | HintEvent
    | ManagerJudgedEvent
    | ManagerRolloutEvent
)


class EventRejected(ValueError):
    """A payload that is not a valid event for its subject; `str()` is the one-line reason."""

    def __init__(self, reason: str, type_name: str | None = None) -> None:
        # Both are stored with the rejected row: made storable here (a type or a key may hold a lone
        # surrogate).
        super().__init__(storable(reason))
        self.type_name = storable(type_name) if type_name is not None else None


def expected_types(subject: str) -> tuple[str, ...]:
    return SUBJECT_TYPES.get(subject.split(".", 1)[0], ())


# One pass in pydantic's own JSON parser for a well-formed event (the audit's common case); anything it
# refuses goes through `_parse_checked`, which says precisely why.
_ANY_EVENT: TypeAdapter[Event] = TypeAdapter(Annotated[Event, Field(discriminator="type")])


def parse_event(subject: str, data: bytes | str) -> Event:
    """The event in `data`, checked against its subject; raises EventRejected with the reason."""
    try:
        event = _ANY_EVENT.validate_json(data)
    except ValidationError:
        return _parse_checked(subject, data)
    if event.TYPE in expected_types(subject) and (
        event.subject() == subject or _subject_fits(event, subject)
    ):
        return event
    return _parse_checked(subject, data)


def _parse_checked(subject: str, data: bytes | str) -> Event:
    try:
        payload = json.loads(data)
    except RecursionError:  # a poison message: thousands of nested arrays or objects
        raise EventRejected("invalid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise EventRejected(f"invalid JSON: {' '.join(str(exc).split())}") from None
    if not isinstance(payload, dict):
        raise EventRejected(f"expected a JSON object, got {type(payload).__name__}")
    type_name = payload.get("type")
    where = unencodable_text(payload)
    if where is not None:  # JSON's "\ud800" escape: no store, file or publish can encode it
        raise EventRejected(
            f"{where}: text holds a lone surrogate, not UTF-8",
            type_name if isinstance(type_name, str) else None,
        )
    expected = expected_types(subject)
    if not expected:
        raise EventRejected(
            f"no event belongs on subject {subject!r}", type_name if isinstance(type_name, str) else None
        )
    if type_name is None:
        raise EventRejected(f"no 'type' field (subject {subject} expects {' or '.join(expected)})")
    if type_name not in expected:
        raise EventRejected(
            f"type {type_name!r} on subject {subject} (expects {' or '.join(expected)})",
            type_name if isinstance(type_name, str) else None,
        )
    model = EVENT_TYPES[type_name]
    try:
        event = model.model_validate(payload)
    except ValidationError as exc:
        raise EventRejected(validation_reason(exc), type_name) from None
    if event.subject() != subject and not _subject_fits(event, subject):
        raise EventRejected(f"{type_name} for {event.subject()} published on {subject}", type_name)
    return event  # type: ignore[return-value]


def unencodable_text(payload: Any) -> str | None:
    """Where in a parsed JSON value a string (or key) cannot be encoded as UTF-8, e.g. `prompt` or
    `metadata.x[2]`; None when all of it can. (pydantic's own JSON parser refuses lone surrogates; the
    slower json.loads path reads them.) A loop, not recursion: the value may be deeply nested."""
    stack: list[tuple[str, Any]] = [("", payload)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if not encodable(value):
                return where or "payload"
        elif isinstance(value, dict):
            for key, item in value.items():
                if not encodable(key):
                    return f"{where}.<key>" if where else "<key>"
                stack.append((f"{where}.{key}" if where else key, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
    return None


def _subject_fits(event: PlaneEvent, subject: str) -> bool:
    """Control events to every worker may also be addressed as control.workers.<id>."""
    return isinstance(event, ControlEvent) and subject.startswith("control.")


def validation_reason(exc: ValidationError) -> str:
    """pydantic's first error as `field[0].sub: message (got value)`, plus how many more."""
    error = exc.errors()[0]
    where = ""
    for part in error["loc"]:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
    message = message.removeprefix("Value error, ")
    value = error.get("input")
    got = "" if error["type"] in ("missing", "extra_forbidden") else f" (got {_short(value)})"
    more = len(exc.errors()) - 1
    return f"{where or 'payload'}: {message}{got}" + (f" (and {more} more)" if more else "")


def _short(value: Any) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (RecursionError, ValueError):  # nested deeper than the encoder goes from here
        text = f"a {type(value).__name__} nested too deeply to show"
    return text if len(text) <= 40 else text[:37] + "..."


def event_ids(event: PlaneEvent) -> dict[str, Any]:
    """The columns the audit keeps for any event (None where the event has no such field)."""
    get = event.__dict__.get
    score = get("score")
    if score is None:
        score = get("reward")
    if score is None:
        score = get("value")  # a judgement of the manager
    return {
        "type": event.TYPE,
        "task_id": get("task_id"),
        "manager_id": get("manager_id"),
        "worker_id": get("worker_id") or (get("target") if isinstance(event, ControlEvent) else None),
        "environment": get("environment"),
        "model_version": get("model_version"),
        "score": score,
        "created_at": get("created_at"),
    }
