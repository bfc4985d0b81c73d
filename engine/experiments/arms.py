"""The arms of an experiment, and the training config of each arm-seed cell, derived from one base config.

Per seed, one SFT run is the warm-up (the base config's `sft_warmup_steps`, at the warm-up's learning
rate and batch) and is the `sft-only` arm. Every GRPO arm of that seed starts from its
weights, so the arms of a seed differ only in what GRPO does (a paired design):

- task-only: GRPO without the coherence rewards;
- cascade: GRPO with the CARL cascade (coherence waits for the task reward, then ramps in);
- always-on: GRPO with the coherence rewards on from the first step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.errors import CarlError

if TYPE_CHECKING:  # the CLI reads ARMS on a base install, which has no training code's dependencies
    from engine.training.config import TrainConfig

ARMS = ("sft-only", "task-only", "cascade", "always-on")
GRPO_ARMS = ARMS[1:]
GATED_ARMS = ("cascade", "always-on")  # the arms with coherence rewards: their gate step means something


class ExperimentError(CarlError):
    """An experiment that cannot run as asked; the message is one line."""


def parse_arms(text: str) -> list[str]:
    arms: list[str] = []
    for arm in (a.strip() for a in text.split(",")):
        if not arm:
            continue
        if arm not in ARMS:
            raise ExperimentError(f"--arms: unknown arm {arm!r} (arms: {', '.join(ARMS)})")
        if arm not in arms:
            arms.append(arm)
    if not arms:
        raise ExperimentError(f"--arms: no arm given (arms: {', '.join(ARMS)})")
    return [a for a in ARMS if a in arms]  # always in the table's order


def parse_seeds(text: str) -> list[int]:
    """'3' means seeds 0, 1, 2; '0,4,7' names them."""
    try:
        if "," not in text:
            count = int(text)
            if count < 1:
                raise ExperimentError(f"--seeds: at least one seed is needed (got {count})")
            return list(range(count))
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ExperimentError(f"--seeds: a count (3) or a list of seeds (0,1,2), not {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ExperimentError(f"--seeds: distinct non-negative seeds are needed (got {text!r})")
    return seeds


def check_base(config: TrainConfig, arms: list[str], source: str) -> None:
    """Refuse, before anything trains, a base config the arms cannot share."""
    from engine.training.config import COHERENCE_REWARDS

    names = config.reward_names
    if config.method != "grpo":
        raise ExperimentError(
            f"{source}: method: an experiment's base config is a GRPO run (got {config.method})"
        )
    if not any(n == "task" or ":" in n for n in names):
        raise ExperimentError(
            f"{source}: rewards: the arms are compared on the task reward, and there is none"
        )
    if "sft-only" in arms and config.sft_warmup_steps == 0:
        raise ExperimentError(f"{source}: sft_warmup_steps: the sft-only arm is the warm-up, and it is 0")
    for arm in ("cascade", "always-on"):
        if arm in arms and not set(COHERENCE_REWARDS) & set(names):
            raise ExperimentError(
                f"{source}: rewards: arm {arm} needs coherence or commitment among the rewards "
                f"({', '.join(names)})"
            )
    if config.sft_warmup_steps and config.lora.enabled and set(arms) & set(GRPO_ARMS):
        raise ExperimentError(
            f"{source}: lora.enabled: the GRPO arms start from the warm-up's full weights; "
            "set lora.enabled: false or sft_warmup_steps: 0"
        )


def cell_config(
    base: TrainConfig, arm: str, seed: int, steps: int, start_model: str | None
) -> dict[str, Any]:
    """The training config of one cell: `start_model` is the warm-up's final weights (GRPO arms)."""
    from engine.training.config import COHERENCE_REWARDS

    data = base.model_dump()
    data["seed"] = seed
    data["eval"]["at_end"] = False  # the experiment evaluates each run itself, once it has ended
    if arm == "sft-only":
        data.update(
            method="sft",
            max_steps=base.sft_warmup_steps,
            sft_warmup_steps=0,
            learning_rate=base.warmup_lr,
            per_device_train_batch_size=base.warmup_batch,
        )
        return data
    data.update(max_steps=steps, sft_warmup_steps=0, model=start_model or base.model)
    if arm == "task-only":
        data["rewards"] = [r for r in data["rewards"] if r["name"] not in COHERENCE_REWARDS]
    data["cascade"]["mode"] = "always" if arm == "always-on" else "gated"
    return data
