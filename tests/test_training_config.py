"""carl.yaml: defaults round-trip through the commented file, and every error is one line naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from engine.training import ConfigError, TrainConfig, load_config, write_default_config
from engine.training.carl_train import init_config
from engine.training.config import default_config_text

DEMO_YAML = Path(__file__).resolve().parent.parent / "engine" / "training" / "demo.yaml"


def error_of(tmp_path: Path, text: str, overrides: dict | None = None) -> str:
    path = tmp_path / "carl.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_commented_default_file_loads_back_to_the_defaults(tmp_path: Path) -> None:
    path = write_default_config(tmp_path / "carl.yaml")
    assert load_config(path) == TrainConfig()
    text = path.read_text()
    # Every setting carries a comment: on its own line, or on the line above a section.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() and not line.lstrip().startswith(("#", "-")) and ":" in line:
            assert "#" in line or lines[i - 1].lstrip().startswith("#"), line
    assert set(yaml.safe_load(text)) == set(TrainConfig.model_fields)


def test_init_writes_the_file_once(tmp_path: Path) -> None:
    init_config(tmp_path / "carl.yaml")
    assert (tmp_path / "carl.yaml").read_text() == default_config_text()
    with pytest.raises(ConfigError, match="already exists"):
        init_config(tmp_path / "carl.yaml")


def test_a_field_error_names_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "carl.yaml"
    assert error_of(tmp_path, "cascade:\n  ramp_steps: 0\n") == (
        f"{path}: cascade.ramp_steps: Input should be greater than 0"
    )
    assert error_of(tmp_path, "rewards:\n  - {name: task}\n  - {name: bogus}\n").startswith(
        f"{path}: rewards[1].name: unknown reward 'bogus'"
    )
    assert error_of(tmp_path, "lora:\n  r: -1\n") == f"{path}: lora.r: Input should be greater than 0"
    assert error_of(tmp_path, "method: dpo\n") == f"{path}: method: Input should be 'grpo' or 'sft'"


def test_unknown_keys_are_rejected(tmp_path: Path) -> None:
    assert error_of(tmp_path, "max_step: 10\n").endswith("carl.yaml: max_step: unknown field")
    assert error_of(tmp_path, "cascade:\n  windw: 3\n").endswith("cascade.windw: unknown field")


def test_cross_field_rules(tmp_path: Path) -> None:
    assert "multiple of num_generations" in error_of(tmp_path, "num_generations: 3\n")
    assert "need a task reward" in error_of(tmp_path, "rewards:\n  - {name: format}\n  - {name: coherence}\n")
    assert "cannot exceed window" in error_of(tmp_path, "cascade:\n  window: 2\n")
    assert "lm_head" in error_of(tmp_path, "lora:\n  target_modules: [q_proj, lm_head]\n")


def test_a_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, "max_steps: 10\nlora:\n  r: [1, 2\nseed: 3\n")
    assert message.startswith(f"{tmp_path / 'carl.yaml'}:4: invalid YAML")
    assert error_of(tmp_path, "- just\n- a list\n").endswith("expected a mapping of settings, found list")


def test_overrides_apply_on_top_and_are_named_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "carl.yaml"
    path.write_text("max_steps: 10\n")
    config = load_config(path, {"max_steps": 20, "model": None, "cascade.window": 7})
    assert (config.max_steps, config.model, config.cascade.window) == (20, "carl-tiny", 7)
    with pytest.raises(
        ConfigError, match=r"^max_steps \(from the command line\): Input should be greater than 0$"
    ):
        load_config(path, {"max_steps": 0})


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")


def test_the_demo_config_is_valid() -> None:
    config = load_config(DEMO_YAML)
    assert config.name == "demo" and config.method == "grpo" and config.sft_warmup_steps > 0
    assert set(config.reward_names) == {"task", "format", "concise", "coherence", "commitment"}


def test_importing_the_training_package_imports_no_torch() -> None:
    code = "import sys, engine.training, engine.training.carl_train; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
