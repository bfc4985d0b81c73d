"""The agents plane's settings: an `agents:` section in a YAML file, flags and environment on top.

Where the plane connects, in order: `--url`, `CARL_NATS_URL` (or `NATS_URL`), `agents.url` in the
config file, else the local nats-server the engine runs. A URL may be a comma-separated list (a
cluster's nodes): a client connects to the first that answers and fails over to the others.
Credentials for a given URL come from a token file (`--token-file`, `CARL_NATS_TOKEN_FILE`,
`agents.token_file`) or a NATS creds file (`--creds`, `agents.creds_file`); the token itself is
never a flag, so it never shows in a process list. Errors name the file and field:
`agents.yaml: agents.workers: ...`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.errors import CarlError
from engine.limits import PORT_MAX, PORT_MIN
from engine.strict import Count, Int, Real
from engine.yamlfile import read_mapping

from .events import TOKEN


class AgentsConfigError(CarlError):
    """A settings problem, as one line naming the file and field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class StreamLimits(_Section):
    max_age_s: Real = Field(7 * 24 * 3600, gt=0, description="events older than this leave the stream")
    max_bytes: Int = Field(1 << 30, gt=0, description="the stream keeps at most this many bytes (oldest go)")
    duplicate_window_s: Real = Field(
        120, gt=0, description="a publish repeating a message id within this window is stored once"
    )


class AlarmSettings(_Section):
    window: Count = Field(20, ge=3, description="results looked at by each alarm")
    collusion_gap: Real = Field(
        0.3, gt=0, le=1, description="collusion: mean |feedback - independent score| above this"
    )
    hint_harm: Real = Field(
        0.2, gt=0, le=1, description="collusion: also when the manager's hints lower the next score this much"
    )
    hacking_high: Real = Field(0.7, gt=0, le=1, description="reward hacking: feedback or PRM at least this")
    hacking_fail: Real = Field(0.5, gt=0, le=1, description="... while the verifier scores below this")
    hacking_share: Real = Field(0.5, gt=0, le=1, description="... in at least this share of the window")
    divergence: Real = Field(
        0.25, gt=0, le=1, description="worker divergence: a worker's mean this far from the others'"
    )


class TrainerSettings(_Section):
    enabled: bool = Field(False, description="train the served model from the plane's rollouts")
    group_size: Count = Field(4, ge=2, description="each prompt is asked this many times: one GRPO group")
    groups_per_update: Count = Field(2, ge=1, description="groups in one optimizer step")
    learning_rate: Real = Field(5e-4, gt=0, description="AdamW learning rate of the LoRA adapter")
    beta: Real = Field(0.04, ge=0, description="weight of the KL to the reference (the base model)")
    clip: Real = Field(0.2, gt=0, lt=1, description="the importance ratio is clipped to [1-clip, 1+clip]")
    publish_every: Count = Field(
        2, ge=1, description="publish a model update every this many optimizer steps"
    )
    lora_r: Count = Field(8, gt=0, description="LoRA rank")
    lora_alpha: Count = Field(16, gt=0, description="LoRA alpha")
    target_modules: str | list[str] = Field(
        "all-linear", description="LoRA target modules (as the served model)"
    )
    max_updates: Count | None = Field(None, gt=0, description="stop training after this many optimizer steps")
    opd: bool = Field(
        False, description="on-policy distillation: a rollout with a hint also learns from the hinted policy"
    )
    w_opd: Real = Field(1.0, ge=0, description="weight of the per-token OPD advantage (OpenClaw-RL's: 1.0)")
    opd_clip: Real = Field(
        1.0, gt=0, description="the teacher - student log-prob gap is clipped to [-opd_clip, opd_clip] nats"
    )


class AgentsSettings(_Section):
    url: str | None = Field(
        None,
        description=(
            "nats:// URL of an existing server, or a comma-separated list of a cluster's (null: local)"
        ),
    )
    token_file: str | None = Field(None, description="file holding the token for `url`")
    creds_file: str | None = Field(None, description="NATS .creds file for `url`")
    tls_ca_file: str | None = Field(None, description="CA certificate for a tls:// server")
    replicas: Count = Field(
        1,
        ge=1,
        le=5,
        description="copies a NATS cluster keeps of the stream and its consumers (3: one node may die)",
    )
    task_type: str = Field("demo", description="the queue the manager assigns to and workers take from")
    workers: Count = Field(2, ge=0, le=64, description="workers `carl agents up` starts")
    worker_kind: Literal["model", "http"] = Field("model", description="model (transformers) or http")
    model: str = Field("carl-tiny", description="the model local workers serve and the trainer trains")
    endpoint: str | None = Field(None, description="OpenAI-compatible base URL for http workers")
    endpoint_model: str | None = Field(None, description="the model name http workers request")
    endpoint_lora: bool = Field(
        False, description="http workers load each new adapter through vLLM's runtime LoRA API and request it"
    )
    system_prompt: str | None = Field(
        None, description="instruction workers send with every task (null: the default)"
    )
    concurrency: Count = Field(4, ge=1, le=1024, description="tasks in flight at once")
    task_timeout_s: Real = Field(120, gt=0, description="a task without a result after this is given up")
    ack_wait_s: Real = Field(30, gt=0, description="a task not acknowledged in this time is redelivered")
    max_new_tokens: Count = Field(48, gt=0, le=4096, description="tokens a model worker generates at most")
    temperature: Real = Field(1.0, gt=0, description="sampling temperature of the workers")
    rate: Real | None = Field(None, gt=0, description="tasks assigned per second at most (null: no limit)")
    judge: Literal["offline", "openai", "claude"] = Field("offline", description="who judges each step")
    judge_url: str | None = Field(None, description="OpenAI-compatible base URL of the judge")
    judge_model: str | None = Field(None, description="judge model name")
    votes: Count = Field(1, ge=1, le=9, description="judge calls per step; the step score is their median")
    feedback: Literal["offline", "claude"] = Field("offline", description="who writes the manager feedback")
    hints: bool = Field(
        True, description="make a hint from each result's directive signal (verifier, error, advice)"
    )
    manager_model: str | None = Field(
        None,
        description="a local model writing the manager's hints, trained on their judged help (null: none)",
    )
    claude_model: str | None = Field(None, description="model of the Claude manager")
    seed: int = Field(
        0, ge=0, description="seeds the workers' sampling (with each worker's id) and the trainer"
    )
    stream: StreamLimits = Field(default_factory=StreamLimits, description="the JetStream stream's limits")
    alarms: AlarmSettings = Field(default_factory=AlarmSettings, description="alarm thresholds")
    train: TrainerSettings = Field(default_factory=TrainerSettings, description="training from rollouts")

    @property
    def trains_manager(self) -> bool:
        """Whether the manager's own model is trained: a manager model, training on, and hints it writes
        (with Claude writing the feedback, Claude writes the hints: it is judged, never trained)."""
        return bool(self.manager_model) and self.train.enabled and self.hints and self.feedback != "claude"

    @field_validator("task_type")
    @classmethod
    def _token(cls, value: str) -> str:
        if not TOKEN.match(value):
            raise ValueError("must be one subject token (letters, digits, _ or -)")
        return value

    @field_validator("url")
    @classmethod
    def _nats_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_url(value)
        return value


def server_urls(url: str) -> list[str]:
    """The servers of `url`: one URL, or a comma-separated list of a cluster's nodes (the NATS convention)."""
    return [part.strip() for part in url.split(",") if part.strip()]


def check_url(url: str) -> str:
    from urllib.parse import urlsplit

    urls = server_urls(url)
    if not urls:
        raise ValueError(f"{url!r} names no server")
    for one in urls:
        parts = urlsplit(one)
        if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
            raise ValueError(f"{one!r} is not a nats:// (or tls://, ws://) URL with a host")
        if parts.username or parts.password:
            raise ValueError("put the token in a token file (token_file), not in the URL")
        try:
            port = parts.port  # urllib refuses text and numbers past 65535 here, with a ValueError
        except ValueError:
            port = 0
        if port == 0 or (port is None and parts.netloc.endswith(":")):
            raise ValueError(f"{one!r}: the port must be a number from {PORT_MIN} to {PORT_MAX}")
    return url


def _field_path(loc: tuple[Any, ...]) -> str:
    out = "agents"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def load_settings(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> AgentsSettings:
    """The `agents:` section of `path` (or of $CARL_HOME/agents.yaml when it exists), with overrides."""
    data: dict[str, Any] = {}
    source = "agents settings"
    if path is not None:
        source = str(path)
        data = _read_section(Path(path))
    for key, value in (overrides or {}).items():
        if value is not None:
            node = data
            *parents, leaf = key.split(".")
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = value
    try:
        return AgentsSettings.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = tuple(error["loc"])
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        message = message.removeprefix("Value error, ")
        given = [key for key, value in (overrides or {}).items() if value is not None]
        overridden = bool(loc) and any(
            tuple(key.split(".")) == tuple(map(str, loc[: key.count(".") + 1])) for key in given
        )
        if overridden:
            raise AgentsConfigError(f"{_field_path(loc)} (from the command line): {message}") from None
        line = _line_of(Path(path), loc) if path is not None else None
        raise AgentsConfigError(
            f"{source}{f':{line}' if line else ''}: {_field_path(loc)}: {message}"
        ) from None


def _line_of(path: Path, loc: tuple[Any, ...]) -> int | None:
    """The line of `agents.<loc>` in the YAML file (1-based), for the error message; None if not found."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in ("agents", *loc):
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                return line
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _read_section(path: Path) -> dict[str, Any]:
    data = read_mapping(path, AgentsConfigError, what="settings with an 'agents' section")
    section = data.get("agents", {})
    if set(data) - {"agents"}:
        extra = sorted(set(data) - {"agents"})[0]
        raise AgentsConfigError(f"{path}: {extra}: unknown section (expected 'agents')")
    if not isinstance(section, dict):
        raise AgentsConfigError(f"{path}: agents: expected a mapping of settings")
    return section


def default_settings_path(home: Path) -> Path | None:
    path = home / "agents.yaml"
    return path if path.is_file() else None


def env_url() -> str | None:
    return os.environ.get("CARL_NATS_URL") or os.environ.get("NATS_URL") or None
