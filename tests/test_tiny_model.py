"""The built-in tiny model: deterministic, offline, and loadable by transformers and mlx-lm."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Nothing in these tests may reach the Hugging Face hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from engine.models.tiny import (  # noqa: E402  (the environment above must come first)
    BUILD_FILE,
    MODEL_FILES,
    build_fingerprint,
    build_tiny_model,
    default_model_dir,
    is_built,
)

PROMPT = [{"role": "user", "content": "Call the weather tool for Paris."}]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "carl-tiny")


def test_build_writes_the_hugging_face_layout(model_dir: Path) -> None:
    for name in (*MODEL_FILES, BUILD_FILE):
        assert (model_dir / name).is_file(), name
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["vocab_size"] == 512
    assert json.loads((model_dir / BUILD_FILE).read_text()) == build_fingerprint(seed=0)
    special = json.loads((model_dir / "special_tokens_map.json").read_text())
    assert special["eos_token"] == "</s>" and special["pad_token"] == "<pad>"


def test_same_seed_builds_identical_files(model_dir: Path, tmp_path: Path) -> None:
    # In a fresh process with another hash seed, so nothing process-local can leak into the files.
    again = tmp_path / "again"
    code = f"import pathlib, engine.models.tiny as t; t.build_tiny_model(pathlib.Path({str(again)!r}))"
    env = {**os.environ, "PYTHONHASHSEED": "7"}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert (again / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    assert sha256(again / "model.safetensors") == sha256(model_dir / "model.safetensors")
    # The seed drives the weights only; the tokenizer comes from the fixed corpus.
    assert sha256(other / "model.safetensors") != sha256(model_dir / "model.safetensors")
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_rebuild_is_skipped_unless_forced_or_stale(tmp_path: Path) -> None:
    out = build_tiny_model(tmp_path / "m")
    weights = out / "model.safetensors"
    built_at = weights.stat().st_mtime_ns

    started = time.monotonic()
    assert build_tiny_model(out) == out
    assert time.monotonic() - started < 0.5
    assert weights.stat().st_mtime_ns == built_at

    build_tiny_model(out, force=True)
    assert weights.stat().st_mtime_ns != built_at

    # A different fingerprint (here: another seed) or a missing file means "not built".
    assert not is_built(out, seed=1)
    (out / "tokenizer.json").unlink()
    assert not is_built(out)
    build_tiny_model(out)
    assert is_built(out)
    assert not list(tmp_path.glob(".m.*")), "the staging directory was left behind"


def test_build_refuses_to_replace_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_tiny_model(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_default_model_dir_is_under_carl_home(tmp_path: Path) -> None:
    assert default_model_dir(tmp_path) == tmp_path / "models" / "carl-tiny"


def test_transformers_loads_and_generates(model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 0)
    call = '{"tool": "get_weather", "args": {"city": "Paris"}}'
    assert tokenizer.decode(tokenizer(call).input_ids) == call
    assert len(tokenizer(call).input_ids) < 24, "the gold call must fit the demo's completion budget"

    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>\nCall the weather tool for Paris.</s>\n<|assistant|>\n"
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert output.shape[1] > inputs.input_ids.shape[1]


def test_mlx_lm_loads_it_and_agrees_with_torch(model_dir: Path) -> None:
    mx = pytest.importorskip("mlx.core")
    mlx_lm = pytest.importorskip("mlx_lm")
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model, tokenizer = mlx_lm.load(str(model_dir))
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    mlx_logits = np.array(model(mx.array([ids])).astype(mx.float32))

    torch_model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        torch_logits = torch_model(torch.tensor([ids])).logits.numpy()
    assert mlx_logits.shape == torch_logits.shape == (1, len(ids), 512)
    # Same weights, same architecture: the two frameworks compute the same function.
    np.testing.assert_allclose(mlx_logits, torch_logits, atol=1e-4)

    text = mlx_lm.generate(model, tokenizer, ids, max_tokens=4)
    assert isinstance(text, str)


def test_importing_the_builder_does_not_import_torch() -> None:
    code = (
        "import sys, engine.models.tiny, engine.demo.trl_run, engine.demo.task; "
        "heavy = {'torch', 'transformers', 'tokenizers', 'trl', 'trackio'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
