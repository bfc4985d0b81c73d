"""Experiments: arms x seeds of real training runs, evaluated on held-out prompts and compared.

`carl experiment` (carl_experiment.py) runs them through the engine (experiment_runner.py); arms.py derives
each cell's config from one base config; results.py and stats.py turn the stored cells into the table.
"""

from .arms import ARMS, ExperimentError

__all__ = ["ARMS", "ExperimentError"]
