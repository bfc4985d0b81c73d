"""`carl eval` and `carl push` of runs the MLX backend trained (mlx[cpu] on this Linux box).

Two real MLX runs of the tiny model, trained through `carl train`: a short LoRA GRPO run and a
full-weights one with a longer SFT warm-up (so its greedy answers differ from prompt to prompt
and some of them stop at eos). The MLX eval stores the same figures as the torch path, and on
the full-weights run its greedy answers are token for token what transformers produces from the
same final/ (the proof that the MLX path answers and measures the same thing). The MLX adapter's
peft copy gives the logits mlx-lm gives with the adapter itself; the pushes reach the local Hub
stand-in with the files and the card that say how to load them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hub_server import HubServer
from test_push import TOKEN, USER, one_error

from engine.store import Store, StoreReader
from engine.training.artifacts import base_model_of, model_files
from engine.training.mlx_artifacts import (
    NotExact,
    convert_to_peft,
    mlx_adapter_to_peft,
    read_safetensors,
    write_safetensors,
)
from engine.training.push import add_push_arguments, model_card, push_from_args

pytest.importorskip("mlx_lm")

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
REWARDS = [{"name": "task"}, {"name": "format", "weight": 0.5}]
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
IDS = [[1, 37, 250, 99, 4, 480, 17, 3, 64, 201, 12, 7, 300, 5]]  # any tokens: the logits are compared


def carl(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", "--home", str(home), *args],
        cwd=ROOT,
        env={**os.environ, **OFFLINE},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def mlx_home(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two MLX runs of the tiny model in one carl home, trained side by side: `lora` (evaluated
    at its end) and `full`."""
    home = tmp_path_factory.mktemp("mlx-home")
    runs = {
        "lora": {
            "max_steps": 4,
            "save_steps": 2,
            "sft_warmup_steps": 3,
            "max_completion_length": 12,
            "lora": {"enabled": True, "r": 4, "alpha": 8},
            "eval": {"holdout": 0.1, "at_end": True, "max_prompts": 8},
        },
        "full": {
            "max_steps": 2,
            "save_steps": 100,
            "sft_warmup_steps": 30,
            "learning_rate": 0.002,
            "max_completion_length": 24,
            "eval": {"holdout": 0.1, "max_prompts": 16},
        },
    }
    with Store(home / "carl.db"):  # made (migrated) before the two runs open it side by side
        pass
    processes = []
    try:
        for name, settings in runs.items():
            config = home / f"{name}.json"
            config.write_text(
                json.dumps(
                    {"name": name, "model": str(tiny_model), "backend": "mlx", "rewards": REWARDS, **settings}
                )
            )
            argv = [
                sys.executable,
                "-m",
                "engine.cli",
                "--home",
                str(home),
                "train",
                "--config",
                str(config),
            ]
            processes.append(
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env={**os.environ, **OFFLINE},
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
        for process in processes:
            out, _ = process.communicate(timeout=240)
            assert process.returncode == 0, out
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return home


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables carl sets for a local model, set here so that they are undone after the test."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


def stored_run(home: Path, name: str) -> dict[str, Any]:
    with Store(home / "carl.db") as store:
        run = store.run(store.run_id_by_name(name))  # type: ignore[arg-type]
    assert run is not None
    return run


def evals_of(home: Path, name: str) -> list[dict[str, Any]]:
    with Store(home / "carl.db") as store:
        rows = store.conn.execute(
            "SELECT e.passed, e.metrics, e.reasons FROM evals e JOIN runs r ON r.id = e.run_id"
            " WHERE r.name = ? ORDER BY e.id",
            (name,),
        ).fetchall()
    return [{"passed": bool(p), "metrics": json.loads(m), "reasons": json.loads(r)} for p, m, r in rows]


def mlx_logits(base: Path, adapter: Path | None) -> np.ndarray:
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(str(base), adapter_path=str(adapter) if adapter else None)
    return np.array(model(mx.array(IDS)).astype(mx.float32))


def peft_logits(base: Path, adapter: Path, subfolder: str | None = None) -> np.ndarray:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(model, adapter, subfolder=subfolder).eval()
    with torch.no_grad():
        return peft_model(torch.tensor(IDS)).logits.numpy()


def handmade_adapter(
    base: Path,
    out: Path,
    *,
    keys: list[str] | None,
    num_layers: int,
    rank: int,
    scale: float,
    dora: bool = False,
    dtype: str = "float32",
) -> Path:
    """An adapter as mlx-lm makes one, with its matrices set by hand from a fixed key (lora_b nonzero,
    so the adapter counts; DoRA's magnitudes as mlx-lm initialises them)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model, _ = load(str(base))
    model.freeze()
    parameters = {"rank": rank, "scale": scale, "dropout": 0.0, "keys": keys}
    linear_to_lora_layers(model, num_layers, parameters, use_dora=dora)
    key = mx.random.key(11)
    weights = {}
    for name, value in tree_flatten(model.trainable_parameters()):
        if name.endswith(("lora_a", "lora_b")):
            key, sub = mx.random.split(key)
            value = 0.2 * mx.random.normal(value.shape, key=sub)
        weights[name] = value.astype(getattr(mx, dtype))
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    config = {
        "fine_tune_type": "dora" if dora else "lora",
        "num_layers": num_layers,
        "lora_parameters": parameters,
        "base_model_name_or_path": str(base),
    }
    (out / "adapter_config.json").write_text(json.dumps(config))
    for name in TOKENIZER:
        shutil.copy2(base / name, out / name)
    return out


# -- carl eval -------------------------------------------------------------------------------


@pytest.mark.slow
def test_carl_eval_of_an_mlx_lora_run_stores_the_figures(mlx_home: Path, tiny_model: Path) -> None:
    run = stored_run(mlx_home, "lora")
    assert run["backend"] == "mlx"
    final = Path(run["output_dir"]) / "final"
    assert {"adapters.safetensors", "adapter_config.json"} <= {f.name for f in final.iterdir()}
    assert base_model_of(final) == str(tiny_model)
    [at_end] = evals_of(mlx_home, "lora")  # the runner's end-of-run eval, on MLX too

    done = carl(mlx_home, "eval", "lora", "--json")
    result = json.loads(done.stdout)
    assert done.returncode == (0 if result["passed"] else 1), done.stderr
    metrics = result["metrics"]
    assert metrics["prompts"] == 8 and len(result["answers"]) == 8 and metrics["step"] == 7
    assert Path(metrics["model_dir"]) == final
    assert (
        0.0 <= metrics["task"] <= 1.0 and 0.0 <= metrics["format"] <= 1.0 and 0.0 <= metrics["solved"] <= 1.0
    )
    assert 0.0 < metrics["phi"] < 1.0 and 0.0 < metrics["entropy"] <= np.log(512)
    assert 1.0 <= metrics["answer_tokens"] <= 12.0
    assert set(result["answers"][0]) == {"prompt", "answer", "task", "format"}
    assert result["reasons"][0].startswith(("mean task reward", "format-compliant answers"))
    # Stored as a row like the torch path's; greedy answers: the same figures as the end-of-run eval.
    first, again = evals_of(mlx_home, "lora")[-2:]
    assert first == at_end and again["metrics"] == metrics and again["reasons"] == result["reasons"]
    assert {k: v for k, v in at_end["metrics"].items() if k != "seconds"} == {
        k: v for k, v in metrics.items() if k != "seconds"
    }


@pytest.mark.slow
def test_the_mlx_eval_answers_as_transformers_does_token_for_token(mlx_home: Path, offline: None) -> None:
    from engine.training import evaluate

    done = carl(mlx_home, "eval", "full", "--json")
    result = json.loads(done.stdout)
    assert done.returncode == (0 if result["passed"] else 1), done.stderr
    assert result["metrics"]["prompts"] == 16 and len(evals_of(mlx_home, "full")) == 1

    # The same final/, the same held-out prompts: transformers (the torch path) and MLX.
    run = stored_run(mlx_home, "full")
    config = evaluate.run_config(run)
    held = evaluate.held_out_prompts(config)
    final = Path(run["output_dir"]) / "final"
    torch_answers, torch_phi, torch_entropy = evaluate._answer(config, final, held[:16], mlx_home)
    mlx_answers, mlx_phi, mlx_entropy = evaluate._answer_mlx(config, final, held[:16], mlx_home)
    assert [a["ids"] for a in mlx_answers] == [a["ids"] for a in torch_answers]
    assert [a["answer"] for a in result["answers"]] == [a["text"] for a in torch_answers]
    np.testing.assert_allclose(mlx_phi, torch_phi, atol=1e-5)
    np.testing.assert_allclose(mlx_entropy, torch_entropy, atol=1e-4)
    assert abs(result["metrics"]["phi"] - np.mean(torch_phi)) <= 1e-4
    # It is a real check: the answers differ between prompts, and some stop at eos before the limit.
    assert len({a["text"] for a in torch_answers}) > 1
    assert min(len(a["ids"]) for a in torch_answers) < config.max_completion_length


# -- the peft copy ---------------------------------------------------------------------------


@pytest.mark.slow
def test_the_peft_copy_of_a_trained_mlx_adapter_gives_its_logits(
    mlx_home: Path, tiny_model: Path, tmp_path: Path, offline: None
) -> None:
    final = Path(stored_run(mlx_home, "lora")["output_dir"]) / "final"
    lora_b = {
        k: v for k, v in read_safetensors(final / "adapters.safetensors").items() if k.endswith("lora_b")
    }
    assert lora_b and all(
        np.frombuffer(data, "<f4").any() for _, _, data in lora_b.values()
    )  # trained: nonzero

    assert mlx_adapter_to_peft(final, tmp_path / "peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["task_type"] == "CAUSAL_LM"
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == str(tiny_model)
    assert config["target_modules"] == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]
    assert config["layers_to_transform"] is None and config["lora_dropout"] == 0.05
    weights = read_safetensors(tmp_path / "peft" / "adapter_model.safetensors")
    a = weights["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = weights["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    assert a[1] == [4, 64] and b[1] == [64, 4] and len(weights) == 28

    with_adapter = mlx_logits(tiny_model, final)
    gap = np.abs(with_adapter - peft_logits(tiny_model, tmp_path / "peft")).max()
    print(f"max |logit difference| mlx-lm adapter vs peft copy (trained): {gap:.3g}")
    assert gap <= 1e-4
    assert np.abs(with_adapter - mlx_logits(tiny_model, None)).max() > 1e-2  # the adapter changes them


@pytest.mark.slow
def test_a_partial_bf16_adapter_converts_exactly_too(tiny_model: Path, tmp_path: Path, offline: None) -> None:
    """The last block only, two modules, a scale that makes a fractional lora_alpha, bf16 weights."""
    adapter = handmade_adapter(
        tiny_model,
        tmp_path / "mlx",
        keys=["self_attn.q_proj", "mlp.down_proj"],
        num_layers=1,
        rank=3,
        scale=0.7,
        dtype="bfloat16",
    )
    convert_to_peft(adapter, tmp_path / "peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["down_proj", "q_proj"] and config["layers_to_transform"] == [1]
    assert config["r"] == 3 and config["lora_alpha"] == pytest.approx(2.1, abs=1e-12)
    weights = read_safetensors(tmp_path / "peft" / "adapter_model.safetensors")
    assert {dtype for dtype, _, _ in weights.values()} == {"BF16"} and len(weights) == 4
    assert all(".layers.1." in name for name in weights)

    gap = np.abs(mlx_logits(tiny_model, adapter) - peft_logits(tiny_model, tmp_path / "peft")).max()
    print(f"max |logit difference| mlx-lm adapter vs peft copy (bf16, partial): {gap:.3g}")
    assert gap <= 1e-4
    assert np.abs(mlx_logits(tiny_model, adapter) - mlx_logits(tiny_model, None)).max() > 1e-2


def test_an_adapter_without_an_exact_peft_form_is_not_converted(
    mlx_home: Path, tiny_model: Path, tmp_path: Path
) -> None:
    final = Path(stored_run(mlx_home, "lora")["output_dir"]) / "final"

    def variant(name: str, **config: Any) -> Path:
        path = tmp_path / name
        shutil.copytree(final, path)
        data = json.loads((path / "adapter_config.json").read_text())
        data.update(config)
        (path / "adapter_config.json").write_text(json.dumps(data))
        return path

    lora = {"rank": 4, "scale": 2.0, "dropout": 0.0, "keys": None}
    cases = {
        variant("dora", fine_tune_type="dora"): "it is a dora adapter",
        variant("negative", lora_parameters={**lora, "scale": -2.0}): "its scale -2.0 is not positive",
        variant("nan", lora_parameters={**lora, "scale": float("nan")}): "its scale nan is not a number",
        variant(
            "elsewhere", base_model_name_or_path=str(tmp_path / "gone")
        ): "its base model 'gone' is not on",
        variant(
            "unnamed", base_model_name_or_path=None
        ): "its adapter_config.json does not name the base model",
    }
    embedding = variant("embedding")  # LoRA on the embedding (mlx-lm's LoRAEmbedding): no peft Linear
    weights = read_safetensors(embedding / "adapters.safetensors")
    weights["model.embed_tokens.lora_a"] = ("F32", [512, 4], bytes(512 * 4 * 4))
    weights["model.embed_tokens.lora_b"] = ("F32", [4, 64], bytes(4 * 64 * 4))
    write_safetensors(embedding / "adapters.safetensors", weights)
    cases[embedding] = "model.embed_tokens is not a layer of the model's blocks"
    for path, reason in cases.items():
        with pytest.raises(NotExact, match="^" + reason.replace("(", r"\(")):
            convert_to_peft(path, tmp_path / "out")
        assert not mlx_adapter_to_peft(path, tmp_path / "out")
        assert not (tmp_path / "out").exists(), "nothing is written when the copy would not be exact"
    # A real DoRA adapter (with its magnitudes) says the same.
    dora = handmade_adapter(
        tiny_model, tmp_path / "real-dora", keys=None, num_layers=2, rank=4, scale=2.0, dora=True
    )
    with pytest.raises(NotExact, match="^it is a dora adapter"):
        convert_to_peft(dora, tmp_path / "out")


def test_a_base_from_the_hub_cache_is_named_by_its_repo_id(tiny_model: Path, tmp_path: Path) -> None:
    """The MLX backend loads a Hub model from the Hugging Face cache and records that directory: the
    peft copy and the card name the repo instead, as its base_model."""
    snapshot = tmp_path / "hf" / "hub" / "models--carl-org--tiny-base" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_model, snapshot)
    adapter = handmade_adapter(
        snapshot, tmp_path / "run" / "final", keys=None, num_layers=2, rank=4, scale=2.0
    )
    convert_to_peft(adapter, tmp_path / "peft")
    peft_config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert peft_config["base_model_name_or_path"] == "carl-org/tiny-base"
    with Store(tmp_path / "carl.db") as store:
        run_id = store.create_run(
            "hubbed",
            source_kind="carl",
            status="finished",
            backend="mlx",
            config={"method": "grpo", "model": "carl-org/tiny-base"},
        )
        run = store.run(run_id)
    reader = StoreReader(tmp_path / "carl.db")
    try:
        card = model_card(run or {}, reader, adapter, repo="alice/hubbed")
    finally:
        reader.close()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["base_model"] == "carl-org/tiny-base" and meta["library_name"] == "mlx"
    assert 'model, tokenizer = load("carl-org/tiny-base", adapter_path=adapter)' in card
    assert 'base = AutoModelForCausalLM.from_pretrained("carl-org/tiny-base")' in card
    assert "not on the Hub" not in card and str(tmp_path) not in card


def test_training_state_is_not_a_model_file(mlx_home: Path) -> None:
    output_dir = Path(stored_run(mlx_home, "lora")["output_dir"])
    checkpoint = max(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    names = {f.name for f in checkpoint.iterdir()}
    assert {"optimizer.safetensors", "carl_state.json", "adapters.safetensors"} <= names
    kept = {f.name for f in model_files(checkpoint)}
    assert kept == names - {"optimizer.safetensors", "carl_state.json"}


# -- carl push -------------------------------------------------------------------------------


@pytest.fixture
def hub(hub_env: None) -> Iterator[HubServer]:
    """The local Hub stand-in, with huggingface_hub kept off the network (conftest's hub_env)."""
    with HubServer({TOKEN: USER}) as server:
        yield server


def push(
    capsys: pytest.CaptureFixture[str], home: Path, hub: HubServer, run: str, repo: str, token: str = TOKEN
) -> tuple[int, str, str]:
    """`carl push RUN REPO` in this process: (exit status, stdout, stderr)."""
    parser = argparse.ArgumentParser()
    add_push_arguments(parser)
    code = push_from_args(
        parser.parse_args([run, repo, "--home", str(home), "--endpoint", hub.url, "--token", token])
    )
    out, err = capsys.readouterr()
    return code, out, err


def pulled(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """The repo's files, as snapshot_download would leave them."""
    out = tmp_path / "pulled"
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return out


@pytest.mark.slow
def test_an_mlx_lora_run_is_pushed_with_its_peft_copy(
    mlx_home: Path, tiny_model: Path, tmp_path: Path, hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    final = Path(stored_run(mlx_home, "lora")["output_dir"]) / "final"
    code, _, err = push(capsys, mlx_home, hub, "lora", "alice/tiny-mlx-lora")
    assert code == 0, err
    assert err.startswith("carl push: 9 files (") and err.endswith(
        " to alice/tiny-mlx-lora (with its peft copy in peft/)\n"
    )
    files = hub.repos["alice/tiny-mlx-lora"].files()
    for name in ("adapters.safetensors", "adapter_config.json", *TOKENIZER):
        assert files[name] == (final / name).read_bytes(), name
    assert {"peft/adapter_model.safetensors", "peft/adapter_config.json"} <= set(files)
    assert not {"optimizer.safetensors", "carl_state.json"} & set(files)
    assert json.loads(files["peft/adapter_config.json"])["r"] == 4

    card = files["README.md"].decode()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "mlx" and "base_model" not in meta  # a local base is not a Hub id
    assert meta["tags"] == ["carl", "grpo", "coherence", "lora", "mlx"]
    assert "A LoRA adapter for mlx-lm" in card and "| backend | MLX (mlx-lm) |" in card
    assert "r=4, alpha=8 (mlx-lm scale 2), targets every linear layer, in the last 2 blocks" in card
    assert 'adapter = snapshot_download("alice/tiny-mlx-lora", allow_patterns=' in card
    assert 'model, tokenizer = load("path/to/' in card and "adapter_path=adapter)" in card
    assert 'PeftModel.from_pretrained(base, "alice/tiny-mlx-lora", subfolder="peft")' in card
    assert "base model is not on the Hub" in card and str(tiny_model) not in card
    assert "evaluation **" in card  # the run's end-of-run eval

    # What was pushed loads both ways the card says, and both give the same logits.
    repo = pulled(tmp_path, files)
    gap = np.abs(mlx_logits(tiny_model, repo) - peft_logits(tiny_model, repo, subfolder="peft")).max()
    assert gap <= 1e-4


@pytest.mark.slow
def test_an_mlx_adapter_without_a_peft_form_is_pushed_alone_and_the_card_says_why(
    tiny_model: Path, tmp_path: Path, hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    output_dir = tmp_path / "runs" / "dora"
    handmade_adapter(tiny_model, output_dir / "final", keys=None, num_layers=2, rank=4, scale=2.0, dora=True)
    with Store(tmp_path / "carl.db") as store:
        run_id = store.create_run(
            "dora",
            source_kind="carl",
            status="finished",
            backend="mlx",
            config={"method": "grpo", "model": str(tiny_model)},
        )
        store.update_run(run_id, output_dir=str(output_dir), last_step=5)
    code, _, err = push(capsys, tmp_path, hub, "dora", "alice/tiny-dora")
    assert code == 0, err
    assert err.endswith(" to alice/tiny-dora (no peft copy)\n")
    files = hub.repos["alice/tiny-dora"].files()
    assert "adapters.safetensors" in files and not any(name.startswith("peft/") for name in files)
    card = files["README.md"].decode()
    assert "in mlx-lm's format only: it has no exact peft equivalent, as it is a dora adapter" in card
    assert "PeftModel" not in card and "adapter_path=adapter" in card


@pytest.mark.slow
def test_a_full_weights_mlx_run_is_pushed_as_it_is(
    mlx_home: Path, tmp_path: Path, hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    final = Path(stored_run(mlx_home, "full")["output_dir"]) / "final"
    code, _, err = push(capsys, mlx_home, hub, "full", "alice/tiny-mlx-full")
    assert code == 0, err
    files = hub.repos["alice/tiny-mlx-full"].files()
    expected = {f.name: f.read_bytes() for f in final.iterdir()}
    assert {k: v for k, v in files.items() if k not in ("README.md", ".gitattributes")} == expected
    card = files["README.md"].decode()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "transformers" and meta["tags"] == ["carl", "grpo", "coherence", "mlx"]
    assert 'AutoModelForCausalLM.from_pretrained("alice/tiny-mlx-full")' in card
    assert 'model, tokenizer = load("alice/tiny-mlx-full")' in card
    assert "| method | GRPO, after 30 SFT warm-up steps |" in card

    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(pulled(tmp_path, files)).config.vocab_size == 512


def test_a_failed_mlx_push_is_still_one_line(
    mlx_home: Path, hub: HubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = push(capsys, mlx_home, hub, "lora", "alice/tiny-mlx-lora", token="hf_wrong_token_000")
    assert (code, out) == (2, "")
    assert one_error(err).startswith("the hub refused the token (401 Unauthorized)")
    assert "hf_wrong_token_000" not in err and hub.repos == {}
