"""Training runs that report to the store: the config, the runner, the backends, `CarlCallback`.

Importing this package imports no torch: the config and the runner's entry points are light,
and the backends (torch, transformers, trl) load only when training starts.

    carl train --config carl.yaml      ->  engine.training.carl_train.train_from_args
    carl train --processes N           ->  engine.training.distributed: N ranks through accelerate
    carl init                          ->  engine.training.carl_train.init_config
    python -m engine.training ...      ->  the same, as its own process
    CarlCallback                       ->  stream your own TRL/transformers script into carl
"""

from typing import TYPE_CHECKING, Any

from .config import ConfigError, TrainConfig, load_config, write_default_config

if TYPE_CHECKING:
    from .callback import CarlCallback
    from .carl_train import add_train_arguments, init_config, train_from_args
    from .runner import run_training

__all__ = [
    "CarlCallback",
    "ConfigError",
    "TrainConfig",
    "add_train_arguments",
    "init_config",
    "load_config",
    "run_training",
    "train_from_args",
    "write_default_config",
]

_LAZY = {
    "CarlCallback": "callback",
    "add_train_arguments": "carl_train",
    "init_config": "carl_train",
    "train_from_args": "carl_train",
    "run_training": "runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)
