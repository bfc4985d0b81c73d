"""The configuration families: carl.yaml, agents.yaml, tui.toml (with its [keymap]), trajectories.toml and
engine.toml, each from its defaults as the product writes them, with hostile values, hostile bytes, or
something that is not a file where the file should be.

A case is fed to the loader the product calls on that file; what it raises is printed the way `carl` prints it
(`carl: <message>`), so the oracle sees what the user would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from engine.text import visible
from hostile import values as hv
from hostile.oracle import ERROR, OK, Outcome, is_user_error
from hostile.runner import Family, Workspace, materialize, path_kind


@dataclass
class ConfigCase:
    name: str  # the file's name
    content: bytes | str  # its bytes, or a special (runner.SPECIALS)


def plain(value: Any) -> Any:
    """A mutated value as a YAML or TOML writer can take it: `Raw` as its text."""
    if isinstance(value, hv.Raw):
        return value.text
    if isinstance(value, dict):
        return {str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def yaml_text(value: Any, unicode: bool) -> bytes:
    import yaml

    return yaml.safe_dump(plain(value), allow_unicode=unicode, sort_keys=False).encode(
        "utf-8", "surrogatepass"
    )


def toml_text(value: Any) -> bytes:
    import tomli_w

    def clean(node: Any) -> Any:  # TOML has no null, and its keys are text
        if isinstance(node, dict):
            return {str(k): clean(v) for k, v in node.items() if v is not None}
        if isinstance(node, list):
            return [clean(v) for v in node if v is not None]
        return node

    return tomli_w.dumps(clean(plain(value))).encode("utf-8", "surrogatepass")


def config_cases(name: str, writer: str) -> Callable[[Any], Any]:
    """Cases of the file `name` from its seed (the product's defaults, made once: `Family.make_seeds`)."""

    @st.composite
    def cases(draw: st.DrawFn, seed: dict[str, Any]) -> ConfigCase:
        value = seed
        if draw(st.integers(0, 7)):
            value = draw(hv.mutated_json(value, max_ops=4))
        try:
            data = yaml_text(value, draw(st.booleans())) if writer == "yaml" else toml_text(value)
        except (ValueError, TypeError, OverflowError, RecursionError):  # a value the writer refuses
            data = yaml_text(seed, True) if writer == "yaml" else toml_text(seed)
        if draw(st.integers(0, 3)) == 0:
            data = draw(hv.mutated_bytes(data))
        return ConfigCase(name, draw(path_kind(data)))

    return lambda seeds: cases(seeds)


def loaded(load: Callable[[Path], Any]) -> Callable[[ConfigCase, Workspace, Path], Outcome]:
    """A feed: lay the file out in the case folder, load it, print an error as `carl` does."""

    def feed(case: ConfigCase, ws: Workspace, where: Path) -> Outcome:
        materialize(where, {case.name: case.content})
        try:
            problems = load(where / case.name)
        except Exception as exc:  # classified: a one-line user error, or a traceback
            if not is_user_error(exc):
                raise
            return Outcome(
                ERROR, str(exc), f"carl: {visible(str(exc))}\n"
            )  # as engine/errors.py fail() prints
        lines = "".join(f"  {visible(problem)}\n" for problem in problems or ())
        if any("\n" in problem for problem in problems or ()):
            return Outcome("traceback", f"a problem over several lines: {problems!r}", lines)
        return Outcome(OK, "", lines)

    return feed


def load_train(path: Path) -> None:
    from engine.training.config import load_config

    load_config(path)


def load_agents(path: Path) -> None:
    from engine.agents.plane_settings import load_settings

    load_settings(path)


def load_tui(path: Path) -> list[str]:
    from carl_tui.keymap import check_keymap, keymap_line, known_ids
    from carl_tui.preferences import load_config

    config = load_config(path.parent)
    _, problems = check_keymap(config.keymap, known_ids())
    return [keymap_line(problems, path)] if problems else []


def load_trajectories(path: Path) -> None:
    from engine.trajectories.trajectory_settings import load

    load(path.parent)


def load_engine(path: Path) -> list[str]:
    from engine.alerts.alert_settings import load_settings

    return load_settings(path.parent)[1]


def train_seed() -> dict[str, Any]:
    from engine.training.config import TrainConfig

    return TrainConfig().model_dump(mode="json")


def agents_seed() -> dict[str, Any]:
    from engine.agents.plane_settings import AgentsSettings

    settings = AgentsSettings().model_dump(mode="json")
    settings["url"] = "nats://127.0.0.1:4222"
    return {"agents": settings}


def tui_seed() -> dict[str, Any]:
    from carl_tui.preferences import TuiConfig

    config = dataclasses.asdict(TuiConfig())
    config["keymap"] = {"help": "h,f1", "quit": "q"}
    config["pins"] = {"grpo-1": ["kl", "reward"]}
    return {k: v for k, v in config.items() if v is not None}


def trajectories_seed() -> dict[str, Any]:
    return {
        "replace_default_domains": False,
        "domains": [{"pattern": "xcodebuild|swift", "skill": "ios-build", "domain": "ios"}],
        "correction_patterns": [r"^(no|wrong)\b"],
        "redo_patterns": [r"\btry again\b"],
    }


def engine_seed() -> dict[str, Any]:
    return {
        "alerts": {
            "webhook": "http://127.0.0.1:9/alerts",
            "command": ["notify-send", "carl"],
            "timeout_s": 10.0,
        }
    }


def config_family(name: str, file: str, seed: Callable[[], dict[str, Any]], writer: str, load: Any) -> Family:
    return Family(name, lambda folder: seed(), config_cases(file, writer), loaded(load), ci_examples=100)


FAMILIES = [
    config_family("carl-yaml", "carl.yaml", train_seed, "yaml", load_train),
    config_family("agents-yaml", "agents.yaml", agents_seed, "yaml", load_agents),
    config_family("tui-toml", "tui.toml", tui_seed, "toml", load_tui),
    config_family("trajectories-toml", "trajectories.toml", trajectories_seed, "toml", load_trajectories),
    config_family("engine-toml", "engine.toml", engine_seed, "toml", load_engine),
]
