"""|V| of an observed run's model, from the model's own `config.json`, wherever the run says it is.

Three places, tried in this order by whoever has none better:
- beside the run: an output dir's `config.json` or its newest `checkpoint-N/` (transformers' Trainer), and
  veRL's checkpoint layout, `global_step_N/actor/huggingface/config.json` (verl/utils/checkpoint/
  fsdp_checkpoint_manager.py saves the model's config there with each checkpoint; the newest N is read), under
  the run's folder or veRL's default `checkpoints/<project>/<experiment>/` (`trainer.default_local_dir`);
- the model path the run's config names (`actor_rollout_ref.model.path` as veRL logs its config to W&B,
  Trackio and MLflow, the last flattened with "/"; transformers' `_name_or_path`, `model_name_or_path`): a
  local folder's `config.json`, or the Hugging Face cache's copy of a hub id's (`HF_HUB_CACHE`, else
  `$HF_HOME/hub`, else `~/.cache/huggingface/hub`: `models--<org>--<name>/snapshots/*/config.json`).

Nothing is downloaded; each file read is bounded (MAX_CONFIG_BYTES) and one that is missing, a FIFO, too big
or not JSON gives nothing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.files import read_regular

from .reader_base import ObserveError, valid_vocab

MAX_CONFIG_BYTES = 4 << 20  # a model's config.json is a few KiB
VERL_STEP = re.compile(r"global_step_(\d+)$")
VERL_CONFIG = Path("actor") / "huggingface" / "config.json"
MODEL_PATH_KEYS = (  # where a run's config names its model, most specific first
    ("actor_rollout_ref", "model", "path"),
    ("actor_rollout_ref/model/path",),
    ("actor_rollout_ref.model.path",),
    ("model", "path"),
    ("model_name_or_path",),
    ("_name_or_path",),
    ("model",),
)
MAX_SNAPSHOTS = 20


def config_file_vocab(path: Path) -> int | None:
    """`vocab_size` of one config.json (a text config's, or a multimodal model's `text_config`)."""
    try:
        config = json.loads(read_regular(path, error=ObserveError, limit=MAX_CONFIG_BYTES))
    except (ObserveError, ValueError, RecursionError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")
    return valid_vocab(config.get("vocab_size")) or (
        valid_vocab(text.get("vocab_size")) if isinstance(text, dict) else None
    )


def newest_verl_checkpoint(folder: Path) -> Path | None:
    """`global_step_N/actor/huggingface/config.json` of the newest N in `folder` that has one."""
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    steps = sorted(((int(m[1]), m[0]) for m in map(VERL_STEP.match, names) if m), reverse=True)
    for _, name in steps:
        config = folder / name / VERL_CONFIG
        if config.is_file():
            return config
    return None


def verl_checkpoint_vocab(folders: list[Path]) -> int | None:
    for folder in folders:
        config = newest_verl_checkpoint(folder)
        vocab = config_file_vocab(config) if config is not None else None
        if vocab is not None:
            return vocab
    return None


def verl_checkpoint_folders(home: Path, log: Path | None) -> list[Path]:
    """Where veRL saves a run's checkpoints: the run's folder, and `checkpoints/<project>/<experiment>/` under
    the folder it started in (its file logger writes `<root>/<project>/<experiment>.jsonl`)."""
    folders = [home, home / "checkpoints"]
    if log is not None and log.suffix == ".jsonl":
        folders.append(log.parent.parent / "checkpoints" / log.parent.name / log.stem)
    return folders


def model_path(config: Any) -> str | None:
    """The model a run's stored config names, if any."""
    if not isinstance(config, dict):
        return None
    for keys in MODEL_PATH_KEYS:
        value: Any = config
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and 0 < len(value) <= 4096 and "\x00" not in value:
            return value
    return None


def model_vocab(path: str) -> int | None:
    """|V| of a model named by a local folder or a hub id whose files are in the Hugging Face cache."""
    local = Path(path).expanduser()
    try:
        if local.is_dir():
            return config_file_vocab(local / "config.json")
    except OSError:
        return None
    for config in _cached_configs(path):
        vocab = config_file_vocab(config)
        if vocab is not None:
            return vocab
    return None


def _cached_configs(repo_id: str) -> Iterator[Path]:
    parts = repo_id.strip("/").split("/")
    if not 1 <= len(parts) <= 2 or not all(re.fullmatch(r"[\w.\-]+", p) for p in parts):
        return
    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub"
    )
    snapshots = Path(cache) / f"models--{'--'.join(parts)}" / "snapshots"
    try:
        entries = sorted(os.scandir(snapshots), key=lambda e: e.name)[:MAX_SNAPSHOTS]
    except OSError:
        return
    for entry in entries:
        yield Path(entry.path) / "config.json"
