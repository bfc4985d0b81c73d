"""Train a LoRA adapter on the stored trajectories, as a carl run the control room shows live.

`advantage`: the OAPL-Lite export (docs/reference/karl.md §6 with rules 12(c) and 12(d)): trajectories with a
positive stored advantage, repeated 1-3 times by tier. `uniform`: the same number of examples drawn
uniformly (the §5 sampler, seeded) from every eligible trajectory whatever its advantage: the
baseline the advantage weighting has to beat. Neither ever sees a hold-out trajectory, so
`plan_eval` can measure both on them. The examples are written under
`$CARL_HOME/trajectory-data/<name>/` and trained with the project's SFT backend (`run_training`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from engine import paths
from engine.errors import CarlError
from engine.store import Store
from engine.store import trajectories as trajectory_rows
from engine.training.artifacts import FINAL_DIR
from engine.training.config import TINY_MODEL, EvalConfig, LoraConfig, TrainConfig
from engine.trajectories.training.export import (
    MIN_PLAN_CHARS,
    MIN_TOOL_EVENTS,
    TRAIN_PC_FILE,
    Example,
    ExportResult,
    build_export,
    example_key,
    messages,
    passes_quality,
    write_examples,
)
from engine.trajectories.training.flowrl_sampler import Record, load_records, sample

TrainStrategy = Literal["advantage", "uniform"]
TRAIN_STRATEGIES: tuple[str, ...] = ("advantage", "uniform")
DATA_DIR = "trajectory-data"


@dataclass
class TrainResult:
    run_name: str
    run_id: int | None
    exit_code: int  # run_training's: 0 finished or stopped, 1 failed, 2 bad input
    status: str | None  # the run's status in the store
    error: str | None
    strategy: str
    model: str
    steps: int
    data_dir: Path
    dataset: Path  # the prompt/completion JSONL the run trained on
    model_dir: Path | None  # runs/<name>/final: the adapter and tokenizer
    examples: int  # training rows (repeats included)
    trajectories: int  # distinct trajectories among them
    valid_examples: int
    final_loss: float | None
    export: ExportResult

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.model_dir is not None


def data_root(home: Path) -> Path:
    return Path(home) / DATA_DIR


def _draw(rng: np.random.Generator, examples: Sequence[Example], n: int) -> list[Example]:
    """n examples: without replacement while there are enough, else with it."""
    picks = rng.choice(len(examples), size=n, replace=n > len(examples))
    return [examples[int(i)] for i in picks]


def _uniform_examples(
    records: Sequence[Record],
    n: int,
    export: ExportResult,
    *,
    min_reward: float,
    quality: str | None,
    seed: int,
) -> list[Example]:
    """n examples from every eligible trajectory (any advantage), drawn uniformly, one copy each."""
    seen = {
        e.key for e in export.valid
    }  # docs/reference/karl.md §12(d) here too: nothing of the validation side
    pool: list[Record] = []
    for r in records:
        if r.holdout or len(r.events) < MIN_TOOL_EVENTS or not passes_quality(r, quality):
            continue
        if (r.reward if r.reward is not None else 0.0) < min_reward:
            continue
        chat = messages(r)
        key = example_key(chat[1]["content"], chat[2]["content"])
        if len(chat[2]["content"]) >= MIN_PLAN_CHARS and key not in seen:
            seen.add(key)
            pool.append(r)
    out: list[Example] = []
    round_ = 0
    while pool and len(out) < n:  # the sampler draws without replacement: as many passes as needed
        for r in sample(pool, n - len(out), "uniform", seed=seed + round_):
            chat = messages(r)
            out.append(Example(r.id, r.uid, example_key(chat[1]["content"], chat[2]["content"]), 1, chat))
        round_ += 1
    return out


def training_examples(
    records: Sequence[Record],
    strategy: TrainStrategy = "advantage",
    *,
    size: int | None = None,
    min_reward: float = 0.0,
    quality: str | None = None,
    seed: int = 0,
) -> tuple[list[Example], ExportResult]:
    """The training rows for a strategy, and the export they were built beside."""
    if strategy not in TRAIN_STRATEGIES:
        raise CarlError(f"unknown training strategy {strategy!r}: use one of {', '.join(TRAIN_STRATEGIES)}")
    export = build_export(records, min_reward=min_reward, quality=quality)
    if strategy == "advantage":
        train = export.train
        if size is not None:
            train = _draw(np.random.default_rng(seed), train, size) if train else []
        return train, export
    n = size if size is not None else export.train_examples
    return _uniform_examples(records, n, export, min_reward=min_reward, quality=quality, seed=seed), export


def _unique_name(store: Store, home: Path, base: str) -> str:
    """A name free both as a run and as a data directory (the run and its data share it)."""
    name, n = base, 1
    while store.run_id_by_name(name) is not None or (data_root(home) / name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def make_config(
    name: str,
    dataset: Path,
    *,
    model: str,
    steps: int,
    lr: float,
    lora_r: int,
    lora_alpha: int,
    batch_size: int,
    seed: int,
) -> TrainConfig:
    return TrainConfig(
        name=name,
        model=model,
        dataset=str(dataset),
        method="sft",
        max_steps=steps,
        learning_rate=lr,
        per_device_train_batch_size=batch_size,
        seed=seed,
        save_steps=steps,
        lora=LoraConfig(enabled=True, r=lora_r, alpha=lora_alpha, target_modules="all-linear"),
        eval=EvalConfig(holdout=0.0),  # the hold-out is by trajectory, already out of the data
    )


def train_adapter(
    home: Path | None = None,
    *,
    strategy: TrainStrategy = "advantage",
    size: int | None = None,
    model: str = TINY_MODEL,
    steps: int = 200,
    name: str | None = None,
    lr: float = 1e-3,
    lora_r: int = 16,
    lora_alpha: int = 32,
    batch_size: int = 8,
    seed: int = 0,
    min_reward: float = 0.0,
    quality: str | None = None,
) -> TrainResult:
    """Build the examples from the store at `home`, write them, and train them as a carl SFT run."""
    from engine.training.runner import run_training  # torch and TRL load only when training starts

    home = paths.carl_home() if home is None else Path(home)
    with Store(paths.db_path(home)) as store:
        records = load_records(store)
        train, export = training_examples(
            records, strategy, size=size, min_reward=min_reward, quality=quality, seed=seed
        )
        if not train:
            raise CarlError(
                f"no training examples: {export.eligible} eligible trajectories, {export.unique} with a "
                "positive advantage (score more trajectories, or lower --min-reward)"
            )
        run_name = _unique_name(store, home, name or f"traj-{strategy}")
    data_dir = data_root(home) / run_name
    files = write_examples(data_dir, train, export.valid)
    config = make_config(
        run_name,
        files["train_pc"],
        model=model,
        steps=steps,
        lr=lr,
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        batch_size=batch_size,
        seed=seed,
    )
    code = run_training(config, home=home, run_name=run_name)
    with Store(paths.db_path(home)) as store:
        run_id = store.run_id_by_name(run_name)
        run = store.run(run_id) if run_id is not None else None
        loss = trajectory_rows.last_loss(store, run_id) if run_id is not None else None
        if code == 0 and strategy == "advantage":
            _record_training(store, run_name, {r.domain_key for r in records})
    final = Path(run["output_dir"]) / FINAL_DIR if run and run.get("output_dir") else None
    return TrainResult(
        run_name=run_name,
        run_id=run_id,
        exit_code=code,
        status=run["status"] if run else None,
        error=run["error"] if run else None,
        strategy=strategy,
        model=model,
        steps=steps,
        data_dir=data_dir,
        dataset=data_dir / TRAIN_PC_FILE,
        model_dir=final if final is not None and final.is_dir() else None,
        examples=len(train),
        trajectories=len({e.record_id for e in train}),
        valid_examples=len(export.valid),
        final_loss=loss,
        export=export,
    )


def _record_training(store: Store, run_name: str, domains: set[str]) -> None:
    """What the retraining triggers compare against: when, how many trajectories, which domains."""
    from engine.trajectories.capture.live import refresh_plasticity

    count = trajectory_rows.count(store)
    store.set_kv(
        "last_train", {"ts": time.time(), "count": count, "domains": sorted(domains), "run": run_name}
    )
    refresh_plasticity(store)


def format_train(result: TrainResult) -> str:
    loss = "-" if result.final_loss is None else f"{result.final_loss:.4f}"
    lines = [
        f"run {result.run_name} (id {result.run_id}): {result.status or 'not started'}"
        + (f" ({result.error})" if result.error else ""),
        f"{result.strategy}: {result.examples} examples from {result.trajectories} trajectories,"
        f" {result.valid_examples} validation examples; {result.steps} steps on {result.model}, "
        f"final loss {loss}",
        f"data {result.data_dir}",
        f"adapter {result.model_dir or '(none saved)'}",
    ]
    return "\n".join(lines)
