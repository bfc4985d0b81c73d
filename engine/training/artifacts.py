"""What a carl run leaves on disk, and which of it is the model.

A run writes `checkpoint-N/` directories while it trains (model, optimizer, trainer state and
`carl_gate.json`) and, once it has finished or stopped, `final/`: the trained model (or LoRA
adapter) with its tokenizer, and nothing else. Evaluation and `carl push` use `final/` when it
is there, else the newest checkpoint, and only its model files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.processes import alive

from .backend import BadInput

FINAL_DIR = "final"
# Files a checkpoint holds for resuming training, not for using the model (the last two: the MLX backend's).
TRAINING_STATE = (
    "optimizer.pt",
    "scheduler.pt",
    "training_args.bin",
    "trainer_state.json",
    "carl_gate.json",
    "scaler.pt",
    "optimizer.safetensors",
    "carl_state.json",
)
TRAINING_STATE_PREFIXES = ("rng_state",)


def is_model_dir(path: Path) -> bool:
    """A full model (config.json) or a LoRA adapter (adapter_config.json) with weights."""
    if not path.is_dir():
        return False
    has_config = (path / "config.json").is_file() or (path / "adapter_config.json").is_file()
    weights = [*path.glob("*.safetensors"), *path.glob("*.bin")]
    has_weights = any(f.name not in TRAINING_STATE for f in weights)
    return has_config and has_weights


def is_adapter(path: Path) -> bool:
    return (path / "adapter_config.json").is_file()


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """The run's `checkpoint-N` directories that hold a model, oldest first."""
    found = []
    for path in output_dir.glob("checkpoint-*"):
        number = path.name.removeprefix("checkpoint-")
        if number.isdigit() and is_model_dir(path):
            found.append((int(number), path))
    return sorted(found)


def model_dir(run: dict[str, Any]) -> Path:
    """The directory holding the run's trained model: `final/`, else its newest checkpoint."""
    name = run.get("name", "?")
    if not run.get("output_dir"):
        raise BadInput(f"run {name!r} has no output directory (was it trained by carl?)")
    output_dir = Path(run["output_dir"])
    final = output_dir / FINAL_DIR
    if is_model_dir(final):
        return final
    found = checkpoints(output_dir)
    if found:
        return found[-1][1]
    raise BadInput(f"run {name!r} has no saved model yet (no {FINAL_DIR}/ or checkpoint-* in {output_dir})")


def model_files(path: Path) -> list[Path]:
    """The files of a model directory a user needs to load it: no optimizer or trainer state."""
    out = []
    for file in sorted(path.iterdir()):
        if not file.is_file() or file.name in TRAINING_STATE or file.name.endswith(".tmp"):
            continue
        if file.name.startswith(TRAINING_STATE_PREFIXES):
            continue
        out.append(file)
    return out


def base_model_of(path: Path) -> str | None:
    """For an adapter: the base model it was trained on, as recorded by peft or by carl's MLX backend
    (`base_model_name_or_path`), or by mlx-lm's own trainer (`model`)."""
    if not is_adapter(path):
        return None
    try:
        data = json.loads((path / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    base = data.get("base_model_name_or_path")
    if not base and "fine_tune_type" in data:  # mlx-lm's trainer records its base as `model`
        base = data.get("model")
    return str(base) if base else None


def lookup_run(store: Any, ref: str) -> dict[str, Any] | None:
    """A run by name (the newest of that name), else by id."""
    run_id = store.run_id_by_name(ref)
    if run_id is None and ref.isdigit():
        run_id = int(ref)
    return store.run(run_id) if run_id is not None else None


def carl_run(store: Any, ref: str, *, for_what: str) -> dict[str, Any]:
    """A run carl trained, by name or id; BadInput naming `for_what` it is not
    (e.g. 'nothing to evaluate')."""
    run = lookup_run(store, ref)
    if run is None:
        raise BadInput(f"{ref}: no such run")
    if run["source_kind"] != "carl":
        raise BadInput(
            f"run {run['name']!r} was not trained by carl (it is {run['source_kind']}): {for_what}"
        )
    return run


def process_alive(pid: int | None) -> bool:
    """Whether a run's process still exists."""
    return alive(pid, others_count=True) if pid else False
