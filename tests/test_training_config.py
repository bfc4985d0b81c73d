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


# -- on-policy distillation (OPD): on MLX only, from a `hint` column ------------------------------------


def test_opd_defaults_are_openclaw_rls_and_its_settings_are_checked(tmp_path: Path) -> None:
    from engine.training import opd

    config = TrainConfig()
    assert (config.opd, config.w_opd, config.opd_clip) == (False, opd.W_OPD, opd.CLIP)
    assert error_of(tmp_path, "w_opd: -0.5\n").endswith("w_opd: Input should be greater than or equal to 0")
    assert error_of(tmp_path, "opd_clip: 0\n").endswith("opd_clip: Input should be greater than 0")
    assert error_of(tmp_path, "opd: true\nmethod: sft\n").endswith(
        "opd: on-policy distillation trains GRPO runs (method: grpo)"
    )
    assert TrainConfig(opd=True, w_opd=0.0).w_opd == 0.0


def test_the_opd_flag_turns_it_on_and_its_absence_keeps_the_config(tmp_path: Path) -> None:
    import argparse

    from engine.training.carl_train import OVERRIDES, add_train_arguments

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    path = tmp_path / "carl.yaml"
    path.write_text("opd: true\n")
    for argv, want in (([], False), (["--opd"], True), (["--config", str(path)], True)):
        args = parser.parse_args(argv)
        config = load_config(args.config, {key: getattr(args, key) for key in OVERRIDES})
        assert config.opd is want, argv


def test_opd_on_torch_is_refused_in_one_line(tmp_path: Path) -> None:
    from engine.training.backend import BadInput
    from engine.training.config import OPD_ON_TORCH
    from engine.training.lifecycle import select_backend
    from engine.training.ranks import training_backend

    assert OPD_ON_TORCH == (
        "opd: OPD in `carl train` runs on the MLX backend; on torch it runs in the agents plane's trainer"
        " (`carl agents up --train --opd`)"
    )
    for check, config in (
        (select_backend, TrainConfig(backend="torch", opd=True)),
        (training_backend, TrainConfig(processes=2, opd=True)),
    ):
        with pytest.raises(BadInput) as info:
            check(config)
        assert str(info.value) == OPD_ON_TORCH
    assert select_backend(TrainConfig(backend="torch")) == "torch"


def test_a_dataset_without_hints_for_opd_is_one_line_naming_the_column(tmp_path: Path) -> None:
    import json

    from engine.training.backend import BadInput
    from engine.training.data import checked_inputs

    def problem(rows: list[dict]) -> str:
        path = tmp_path / "rows.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        config = TrainConfig(dataset=str(path), opd=True, task="reference", rewards=[{"name": "task"}])
        with pytest.raises(BadInput) as info:
            checked_inputs(config, tmp_path / "home")
        assert "\n" not in str(info.value)
        return str(info.value)

    rows = [{"prompt": f"say {i}", "reference": str(i)} for i in range(4)]
    assert problem(rows) == (
        f"dataset {tmp_path / 'rows.jsonl'}: opd needs a 'hint' column in every row (text; empty or null"
        " where a row has no hint); columns: prompt, reference"
    )
    assert "opd needs a 'hint' column" in problem([{**r, "hint": "x"} for r in rows[:3]] + rows[3:])
    assert problem([{**r, "hint": 3 if i == 2 else ""} for i, r in enumerate(rows)]) == (
        f"dataset {tmp_path / 'rows.jsonl'}: row 3: 'hint' is int, not text or null"
    )
