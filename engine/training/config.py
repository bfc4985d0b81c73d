"""`carl.yaml`: the training configuration, validated by pydantic.

Every field has a default and a one-line description; `write_default_config` turns the
descriptions into the comments of the file `carl init` writes, so the file and the schema never
drift apart. Errors are one line naming the file and the field (`carl.yaml: lora.r: ...`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine.errors import CarlError
from engine.files import named
from engine.strict import Count, Name, Real, Seed
from engine.yamlfile import read_mapping

BUILTIN_REWARDS = ("task", "format", "coherence", "commitment", "concise")
# opd.W_OPD and opd.CLIP (OpenClaw-RL's launcher's defaults), written out: opd.py imports numpy, and the
# control room reads this module (tests/test_opd_mlx.py holds them equal).
OPD_WEIGHT, OPD_CLIP = 1.0, 1.0
OPD_ON_TORCH = (
    "opd: OPD in `carl train` runs on the MLX backend; on torch it runs in the agents plane's trainer"
    " (`carl agents up --train --opd`)"
)
COHERENCE_REWARDS = ("coherence", "commitment")  # gated by the cascade, capped below the task reward
TINY_MODEL = "carl-tiny"  # the built-in model, built on first use under $CARL_HOME/models
DEMO_DATASET = "demo"
MAX_PATH = 4096  # characters of a path or hub id (Linux's PATH_MAX)


class ConfigError(CarlError):
    """A configuration problem, as one line: `file: field: what is wrong`."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraConfig(_Section):
    enabled: bool = Field(False, description="train a LoRA adapter instead of every weight")
    r: Count = Field(16, gt=0, description="adapter rank")
    alpha: Count = Field(32, gt=0, description="adapter scale numerator (scale = alpha / r)")
    dropout: Real = Field(0.05, ge=0.0, lt=1.0, description="dropout on the adapter's input")
    target_modules: str | list[str] = Field(
        "all-linear", description='"all-linear" or a list of module names (never lm_head)'
    )

    @field_validator("target_modules")
    @classmethod
    def _no_lm_head(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if "lm_head" in names:
            raise ValueError("lm_head cannot take a LoRA adapter (TRL's fused head multiplies it directly)")
        return value


class RewardSpec(_Section):
    name: str = Field(description="one of task, format, coherence, commitment, concise, or 'pkg.mod:fn'")
    weight: Real = Field(1.0, ge=0.0, description="weight in the summed reward")

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value in BUILTIN_REWARDS:
            return value
        module, _, func = value.partition(":")
        if module and func and func.isidentifier() and all(p.isidentifier() for p in module.split(".")):
            return value
        raise ValueError(
            f"unknown reward {value!r}: use one of {', '.join(BUILTIN_REWARDS)} or 'pkg.module:function'"
        )


class CascadeConfig(_Section):
    mode: Literal["gated", "always"] = Field(
        "gated",
        description="gated: coherence waits for the task reward (the CARL cascade); always: on from step one",
    )
    min_points: Count = Field(5, gt=0, description="task-reward history (steps) before the gate may open")
    percentile: Real = Field(0.6, gt=0.0, lt=1.0, description="threshold = this percentile of the history")
    window: Count = Field(5, gt=0, description="recent steps looked at")
    min_above: Count = Field(3, gt=0, description="steps of the window that must beat the threshold (and 0)")
    ramp_steps: Count = Field(10, gt=0, description="steps over which coherence weights ramp in once open")
    cap_ratio: Real = Field(
        0.5, gt=0.0, lt=1.0, description="a coherence weight may be at most this times the task weight"
    )

    @model_validator(mode="after")
    def _window_holds_min_above(self) -> CascadeConfig:
        if self.min_above > self.window:
            raise ValueError(f"min_above ({self.min_above}) cannot exceed window ({self.window})")
        return self


class EvalConfig(_Section):
    holdout: Real = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="share of the dataset's prompts held out of training, for `carl eval`",
    )
    at_end: bool = Field(False, description="evaluate on the held-out prompts when the run finishes")
    max_prompts: Count = Field(64, gt=0, description="held-out prompts evaluated at most")
    min_task: Real = Field(0.5, description="pass needs the mean task reward on held-out prompts >= this")
    min_format: Real = Field(
        0.8, ge=0.0, le=1.0, description="pass needs this share of answers fully format-compliant"
    )
    min_phi: Real | None = Field(
        None, description="pass needs mean Phi of the answers >= this (null: report only)"
    )
    solved_at: Real = Field(1.0, description="a held-out prompt counts as solved at this task reward")
    min_solved: Real | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="pass needs this share of held-out prompts solved (null: report only)",
    )


def _default_rewards() -> list[RewardSpec]:
    return [
        RewardSpec(name="task", weight=1.0),
        RewardSpec(name="format", weight=0.5),
        RewardSpec(name="concise", weight=0.25),
        RewardSpec(name="coherence", weight=0.25),
        RewardSpec(name="commitment", weight=0.25),
    ]


class TrainConfig(_Section):
    name: Name = Field(
        "run",
        min_length=1,
        description="run name (a taken name gets a -2, -3, ... suffix; at most 128 characters)",
    )
    model: str = Field(
        TINY_MODEL,
        min_length=1,
        max_length=MAX_PATH,
        description="'carl-tiny' (built-in), a local directory or a hub id",
    )
    dataset: str = Field(
        DEMO_DATASET,
        min_length=1,
        max_length=MAX_PATH,
        description="'demo' or a .jsonl/.json file with a prompt column",
    )
    task: Literal["auto", "toolcall", "reference"] = Field(
        "auto",
        description="how `task` and `format` check answers: toolcall (answer_tool, answer_<arg> columns),"
        " reference (a reference column); auto reads it off the dataset",
    )
    method: Literal["grpo", "sft"] = Field("grpo", description="grpo (reinforcement) or sft (supervised)")
    backend: Literal["auto", "torch", "mlx"] = Field(
        "auto",
        description="auto: mlx on Apple silicon with mlx installed, else torch (CUDA when there is one)",
    )
    processes: Count = Field(
        1,
        gt=0,
        description="data-parallel training processes (torch, through accelerate): at most the GPUs,"
        " or the CPU cores without one",
    )
    max_steps: Count = Field(100, gt=0, description="optimizer steps of the main phase (after any warm-up)")
    learning_rate: Real = Field(
        1e-3, gt=0.0, description="1e-3 suits carl-tiny; ~1e-5 for LoRA on a real model"
    )
    num_generations: Count = Field(8, ge=2, description="completions sampled per prompt (the GRPO group)")
    per_device_train_batch_size: Count = Field(
        8, gt=0, description="completions per step; a multiple of num_generations"
    )
    max_completion_length: Count = Field(24, gt=0, description="tokens generated per completion at most")
    temperature: Real = Field(1.0, gt=0.0, description="sampling temperature (Phi is measured at it)")
    phi_source: Literal["generate", "forward"] = Field(
        "generate",
        description="where the coherence rewards get Phi: generate (while sampling, no extra forward; a"
        " forward where that cannot be hooked) or forward (always one no-grad forward)",
    )
    beta: Real = Field(
        0.0, ge=0.0, description="GRPO: weight of the KL to the reference (the starting model); 0 skips it"
    )
    epsilon: Real = Field(
        0.2, gt=0.0, lt=1.0, description="GRPO: the importance ratio is clipped to [1 - epsilon, 1 + epsilon]"
    )
    opd: bool = Field(
        False,
        description="GRPO on MLX: on-policy distillation from the dataset's 'hint' column (the same model"
        " with the hint in its context is the teacher of each hinted sample's tokens)",
    )
    w_opd: Real = Field(
        OPD_WEIGHT,
        ge=0.0,
        description="weight of the OPD advantage added to GRPO's, per token (OpenClaw-RL's 1.0)",
    )
    opd_clip: Real = Field(
        OPD_CLIP,
        gt=0.0,
        description="the teacher - student log-prob gap is clipped to +-this, nats (OpenClaw-RL's)",
    )
    seed: Seed = Field(0, ge=0, description="random seed")
    rollouts_per_step: Count = Field(
        64,
        ge=0,
        description="GRPO samples stored a step for the rollouts viewer, with per-token entropy"
        " (whole groups, the first ones; 0: none)",
    )
    save_steps: Count = Field(20, gt=0, description="checkpoint every this many steps")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter")
    sft_warmup_steps: Count = Field(
        0,
        ge=0,
        description=(
            "SFT steps on the gold completions before GRPO (0: none); "
            "see warmup_learning_rate and warmup_batch_size"
        ),
    )
    warmup_learning_rate: Real | None = Field(
        None, gt=0.0, description="learning rate of the SFT warm-up (null: 5x learning_rate)"
    )
    warmup_batch_size: Count | None = Field(
        None,
        gt=0,
        description="completions per step of the SFT warm-up (null: 4x per_device_train_batch_size)",
    )
    rewards: list[RewardSpec] = Field(
        default_factory=_default_rewards, min_length=1, description="reward functions and their weights"
    )
    aggregation: Literal["normalize_then_sum", "sum_then_normalize"] = Field(
        "normalize_then_sum",
        description="normalize each reward in its group, then weight: weights are shares",
    )
    cascade: CascadeConfig = Field(
        default_factory=CascadeConfig, description="the gate of the coherence rewards"
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="the held-out evaluation (`carl eval`)")
    output_dir: str | None = Field(
        None, max_length=MAX_PATH, description="checkpoints go here (default: $CARL_HOME/runs/<id>-<name>)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.method == "grpo" and self.per_device_train_batch_size % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size ({self.per_device_train_batch_size}) must be a multiple of"
                f" num_generations ({self.num_generations})"
            )
        if self.opd and self.method != "grpo":
            raise ValueError("opd: on-policy distillation trains GRPO runs (method: grpo)")
        names = [r.name for r in self.rewards]
        if len(set(names)) != len(names):
            raise ValueError(f"rewards: a reward is listed twice ({', '.join(names)})")
        gated = [n for n in names if n in COHERENCE_REWARDS]
        if gated and not any(n == "task" or ":" in n for n in names):
            raise ValueError(
                f"rewards: {', '.join(gated)} need a task reward to gate them (add 'task' or 'pkg.mod:fn')"
            )
        return self

    @property
    def reward_names(self) -> list[str]:
        return [r.name for r in self.rewards]

    @property
    def warmup_lr(self) -> float:
        """The SFT warm-up's learning rate: a short warm-up on gold answers moves fast."""
        return self.warmup_learning_rate or self.learning_rate * 5

    @property
    def warmup_batch(self) -> int:
        return self.warmup_batch_size or self.per_device_train_batch_size * 4

    @property
    def total_steps(self) -> int:
        """Steps the run reports: the SFT warm-up first (GRPO only), then the main phase."""
        return self.max_steps + (self.sft_warmup_steps if self.method == "grpo" else 0)


# -- loading ---------------------------------------------------------------------------------


def _field_path(loc: tuple[Any, ...], data: dict[str, Any]) -> str:
    """pydantic's location as the user wrote it: rewards[1].weight, cascade.ramp_steps."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _one_line(exc: ValidationError, source: str, data: dict[str, Any], overridden: set[str]) -> str:
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    path = _field_path(loc, data)
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    where = f"{source}: {path}" if loc else source
    if loc and str(loc[0]) in overridden:
        where = f"{path} (from the command line)"
    more = len(exc.errors()) - 1
    return f"{where}: {message}" + (f" (and {more} more)" if more else "")


def _apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> set[str]:
    """Set `key` or dotted `section.key` values; None means "not given". Returns top-level keys set."""
    touched = set()
    for key, value in overrides.items():
        if value is None:
            continue
        *parents, leaf = key.split(".")
        node = data
        for parent in parents:
            child = node.get(parent)
            if not isinstance(child, dict):
                child = node[parent] = {}
            node = child
        node[leaf] = value
        touched.add(key.split(".")[0])
    return touched


def _read_yaml(path: Path) -> dict[str, Any]:
    return read_mapping(path, ConfigError, missing="no such file (write one with `carl init`)")


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read carl.yaml (or only the defaults when path is None), apply overrides, validate."""
    data = _read_yaml(Path(path)) if path is not None else {}
    return config_from_data(data, named(path) if path is not None else "config", overrides)


def config_from_data(
    data: dict[str, Any], source: str, overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """Validate settings (e.g. a run's stored config) with overrides on top; `source` names them in errors."""
    data = json_copy(data)
    overridden = _apply_overrides(data, overrides or {})
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, source, data, overridden)) from None


def json_copy(data: dict[str, Any]) -> dict[str, Any]:
    return {k: (json_copy(v) if isinstance(v, dict) else v) for k, v in data.items()}


# -- the commented default file ----------------------------------------------------------------


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _section_lines(model: type[BaseModel], values: dict[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    for name, info in model.model_fields.items():
        value = values[name]
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines += [f"{indent}# {info.description}", f"{indent}{name}:"]
            lines += _section_lines(annotation, value, indent + "  ")
        elif name == "rewards":
            lines += [
                f"{indent}# {info.description}; coherence ones are gated and capped",
                f"{indent}{name}:",
            ]
            for item in value:
                lines.append(
                    f"{indent}  - {{name: {_scalar(item['name'])}, weight: {_scalar(item['weight'])}}}"
                )
        else:
            lines.append(f"{indent}{name}: {_scalar(value)}  # {info.description}")
    return lines


def default_config_text() -> str:
    header = [
        "# carl.yaml: a training run for `carl train --config carl.yaml`.",
        "# Every setting is shown with its default; command-line flags override them.",
        "",
    ]
    return "\n".join(header + _section_lines(TrainConfig, TrainConfig().model_dump(), "")) + "\n"


def write_default_config(path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the commented default carl.yaml (refuses to replace an existing file unless asked)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: already exists; not replacing it")
    try:
        path.write_text(default_config_text(), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write it ({exc.strerror})") from None
    return path


def training_config_path(config: str) -> Path:
    """'demo' names the built-in demo config shipped with the package; anything else is a path."""
    if config == "demo":
        return Path(__file__).resolve().with_name("demo.yaml")
    return Path(config).expanduser().resolve()
