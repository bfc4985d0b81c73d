"""The plane serves a run: each checkpoint the run saves, and in the end its final model, becomes a
model update that the workers swap in.

`RunFollower` follows one of our runs through the store: while the run trains, its newest complete
checkpoint (the runner records a `checkpoint` event once one is whole); once it has one, its
`final/`. A newer one than the plane last announced is put in the plane's object store and announced
as `<run>-v<step>` (`serve_weights`), a LoRA adapter or every weight of the model, whichever the run
trained. A finished run is served its final model at once; a running one is followed to its end.

It reads the store (one short query a tick, in the engine's loop); the packing, the upload and the
publish run in the plane's bridge (an asyncio loop of their own), off the engine's loop.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.models.tiny import default_model_dir
from engine.store.agent_plane import saved_weights
from engine.training.artifacts import FINAL_DIR, lookup_run
from engine.training.config import TINY_MODEL
from engine.training.data import is_local_model

from .events import ModelUpdateEvent, WeightsKind
from .server import AgentsError
from .weights import WeightsError, publish_update, weights_kind


@dataclass(frozen=True)
class RunWeights:
    """One saved state of a run's model: what the plane announces."""

    run: str
    step: int  # the run's step (its store step: a warm-up's steps included)
    path: Path
    kind: WeightsKind
    base_model: str
    final: bool = False

    @property
    def version(self) -> str:
        return f"{self.run}-v{self.step:04d}"


class RunFollower:
    """Which of a run's saved states the plane should serve next (None: nothing newer than announced)."""

    def __init__(self, ref: str, home: Path, *, served_model: str) -> None:
        self.ref = ref  # the run's name (or id), as asked for
        self.home = home
        self.served_model = served_model  # the model the workers serve: the run must have trained it
        self.published_step: int | None = None  # the newest step announced
        self.run_name = ref
        self.state = "waiting"  # waiting | serving | refused
        self.detail = f"waiting for run {ref}"

    def resume_from(self, announced: dict[str, Any] | None) -> None:
        """After a restart: what the plane announced before (the audit's `agents.model`), if it was this
        run's (its version is `<run>-v<step>`), is not announced again."""
        step = (announced or {}).get("step")
        if (
            isinstance(step, int)
            and announced
            and announced.get("model_version") == f"{self.ref}-v{step:04d}"
        ):
            self.published_step = step
            self.state, self.detail = "serving", f"serving {announced['model_version']}"

    def next_weights(self, store: Any) -> RunWeights | None:
        run = lookup_run(store, self.ref)
        if run is None:
            return None
        self.run_name = str(run["name"])
        if run.get("source_kind") != "carl" or not run.get("output_dir"):
            self._refuse(f"run {self.run_name} was not trained by carl: it has no checkpoints to serve")
            return None
        if run.get("model") and run["model"] != self.served_model:
            self._refuse(
                f"run {self.run_name} trains {run['model']}, but the workers serve {self.served_model}"
            )
            return None
        found = newest_weights(store, run)
        if found is None or (self.published_step is not None and found.step <= self.published_step):
            if self.published_step is None:
                self.detail = f"run {self.run_name} has no checkpoint yet"
            return None
        return found

    def announced(self, update: ModelUpdateEvent) -> None:
        self.published_step = update.step
        self.state, self.detail = "serving", f"serving {update.model_version}"

    def _refuse(self, reason: str) -> None:
        self.state, self.detail = "refused", reason

    def describe(self) -> dict[str, Any]:
        """What the control room shows of it (the plane's kv row)."""
        return {
            "run": self.run_name,
            "state": self.state,
            "step": self.published_step,
            "detail": self.detail,
        }


def newest_weights(store: Any, run: dict[str, Any]) -> RunWeights | None:
    """The run's newest saved weights still on disk: its `final/` or its newest checkpoint (the final
    model when both stand for the same step)."""
    run_id, name, model = run["id"], str(run["name"]), str(run.get("model") or "")
    for step, kind, detail in saved_weights(store, run_id):
        path = Path(str(detail or ""))
        if kind == "final" and path.name != FINAL_DIR:
            continue
        found = weights_kind(path) if path.is_dir() else None
        if found is not None and step is not None:
            return RunWeights(name, int(step), path, found, model, final=kind == "final")
    return None


def base_fingerprint_of(model: str, home: Path) -> str:
    """The fingerprint workers compare (policy.base_fingerprint: 16 hex digits of the sha256 of the
    base's config.json), without loading anything; "" when the config is not on this machine."""
    if model == TINY_MODEL:
        config = default_model_dir(home) / "config.json"
    elif is_local_model(model):
        config = Path(model).expanduser() / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
        except Exception:
            cached = None
        if not isinstance(cached, str):
            return ""
        config = Path(cached)
    try:
        return hashlib.sha256(config.read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


async def serve_weights(js: Any, weights: RunWeights, home: Path, *, replicas: int = 1) -> ModelUpdateEvent:
    """Put the run's weights in the plane's object store (a bucket made with `replicas` copies, as the
    stream is) and announce them on `model.updates`."""
    update = ModelUpdateEvent(
        model_version=weights.version,
        checkpoint_path=str(weights.path),
        base_model=weights.base_model,
        base_fingerprint=base_fingerprint_of(weights.base_model, home),
        step=weights.step,
        run=weights.run,
        weights=weights.kind,
    )
    if weights.kind == "adapter" and not (weights.path / "adapter_model.safetensors").is_file():
        return await _serve_mlx_adapter(js, update, weights.path, replicas)
    return await publish_update(js, update, replicas=replicas)


async def _serve_mlx_adapter(
    js: Any, update: ModelUpdateEvent, path: Path, replicas: int
) -> ModelUpdateEvent:
    """An MLX run's adapter goes out as its exact peft copy (workers load adapters through peft)."""
    from engine.training.mlx_artifacts import is_mlx_adapter, mlx_adapter_to_peft

    if not is_mlx_adapter(path):
        raise WeightsError(f"{path}: an adapter_config.json without adapter weights")
    with tempfile.TemporaryDirectory(prefix="carl-peft-") as tmp:
        if not mlx_adapter_to_peft(path, Path(tmp)):
            raise AgentsError(f"{path}: this MLX adapter has no exact peft equivalent to serve")
        return await publish_update(js, update, Path(tmp), replicas=replicas)
