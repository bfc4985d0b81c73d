"""The plane serves the run it watches: a real demo-like run (SFT warm-up, then GRPO) trains in its own
process while the engine's plane follows it; each checkpoint it saves goes out as a model update whose
weights travel through the object store, the worker swaps every weight in, the pane's kv row says which
run and step are served, and the worker's verifier score rises from the base model's to the trained
run's. Also: a full-weight swap is exact and refuses weights that do not fit; `--serve-run` is checked
before the engine is asked."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np
import pytest
import yaml

from engine.agents.events import ModelUpdateEvent
from engine.agents.plane import Plane, PlaneSpec
from engine.agents.policy import LocalPolicy, PolicyError
from engine.agents.serving import RunFollower
from engine.store import Store, StoreReader
from engine.training.config import training_config_path

PROMPT = "What is the weather in Paris?"


@pytest.fixture
def home(tiny_home: Path) -> Path:
    return tiny_home


# -- the full-weight swap ---------------------------------------------------------------------------


def fine_tuned(home: Path, out: Path, *, scale: float = 0.05, break_shape: bool = False) -> Path:
    """Every weight of the tiny model moved a little, saved as a run's checkpoint would be."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.tiny import default_model_dir

    AutoTokenizer.from_pretrained(default_model_dir(home)).save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir(home), dtype=torch.float32)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))
    model.save_pretrained(out)
    if break_shape:
        from safetensors.torch import load_file, save_file

        state = load_file(str(out / "model.safetensors"))
        key = next(k for k in state if k.endswith("q_proj.weight"))
        state[key] = state[key][:, :-1].contiguous()
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_every_weight_of_a_run_swaps_in_exactly_and_weights_that_do_not_fit_are_refused(
    home: Path, tmp_path: Path
) -> None:
    worker = LocalPolicy.load("carl-tiny", home, seed=0)
    asked = worker.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=1)
    base = np.array(worker.score(asked.prompt_token_ids, asked.token_ids))

    trained = fine_tuned(home, tmp_path / "checkpoint-10")
    worker.swap_full_weights(trained, "run-v0010", worker.fingerprint)
    assert (worker.version, worker.full_weights) == ("run-v0010", "run-v0010")
    reference = LocalPolicy.load(str(trained), home, seed=0)  # the same weights, loaded from scratch
    served = np.array(worker.score(asked.prompt_token_ids, asked.token_ids))
    assert np.abs(served - np.array(reference.score(asked.prompt_token_ids, asked.token_ids))).max() <= 1e-6
    assert np.abs(served - base).max() > 1e-3

    broken = fine_tuned(home, tmp_path / "checkpoint-20", scale=0.5, break_shape=True)
    with pytest.raises(PolicyError) as info:
        worker.swap_full_weights(broken, "run-v0020", worker.fingerprint)
    message = str(info.value)
    assert "\n" not in message and "q_proj.weight" in message and "shape" in message
    assert worker.version == "run-v0010"  # nothing changed: still the weights it served
    again = np.array(worker.score(asked.prompt_token_ids, asked.token_ids))
    assert np.abs(again - served).max() == 0.0
    with pytest.raises(PolicyError, match="trained from base 0123456789abcdef"):
        worker.swap_full_weights(trained, "run-v0030", "0123456789abcdef")

    # An adapter comes later: it goes on the base again, not on the run's weights.
    from peft import LoraConfig, get_peft_model

    from engine.models.tiny import default_model_dir

    fresh = get_peft_model(
        LocalPolicy.load("carl-tiny", home).model, LoraConfig(r=4, target_modules="all-linear")
    )
    fresh.save_pretrained(tmp_path / "adapter")  # B is zero: the adapter policy is the base's
    worker.swap_adapter(tmp_path / "adapter", "agents-v0001", worker.fingerprint)
    assert worker.full_weights is None and worker.version == "agents-v0001"
    on_base = np.array(worker.score(asked.prompt_token_ids, asked.token_ids))
    assert np.abs(on_base - base).max() <= 1e-6
    assert default_model_dir(home).is_dir()


# -- the plane following a real run -------------------------------------------------------------------


def small_demo(home: Path) -> Path:
    """The demo's config, shortened: a warm-up long enough to learn the call shape, then GRPO that saves
    twice (the plane's worker serves the base, then each checkpoint)."""
    config = yaml.safe_load(training_config_path("demo").read_text())
    config.update(sft_warmup_steps=300, max_steps=20, save_steps=10, eval={**config["eval"], "at_end": False})
    path = home / "small-demo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait(what: str, check: Any, tick: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tick()
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def audit(home: Path, kind: str) -> list[dict[str, Any]]:
    reader = StoreReader(home / "carl.db")
    try:
        return [json.loads(r["payload"]) for r in reader.agent_audit(kind=kind, limit=None)]
    finally:
        reader.close()


@pytest.mark.slow
@pytest.mark.timeout(900)  # minutes of training: far from its limit on a busy machine
def test_the_plane_serves_the_demo_run_it_watches_and_its_score_rises(home: Path) -> None:
    config = small_demo(home)
    store = Store(home / "carl.db")
    plane = Plane(store, home)
    runner = None
    try:
        # As `carl demo` does: the plane is asked to serve the run before the run exists.
        line = plane.start(
            PlaneSpec(
                workers=1,
                tasks="demo",
                serve_run="demo",
                overrides={"system_prompt": "", "rate": 4.0, "max_new_tokens": 24},
            )
        )
        assert line.endswith("serving run demo")
        runner = subprocess.Popen(
            [sys.executable, "-m", "engine.training", "--home", str(home), "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        finished = lambda: (store.run(store.run_id_by_name("demo") or 0) or {}).get("status") == "finished"  # noqa: E731
        wait("the run to finish", finished, plane.tick, 600)
        last = store.run(store.run_id_by_name("demo") or 0)["last_step"]  # type: ignore[index]
        final = f"demo-v{last:04d}"
        serving = lambda: (store.kv("agents.plane") or {}).get("serving") or {}  # noqa: E731
        wait("the final weights announced", lambda: serving().get("step") == last, plane.tick, 120)
        results = lambda: [r for r in audit(home, "result") if r["model_version"] == final]  # noqa: E731
        wait("10 answers of the final model", lambda: len(results()) >= 10, plane.tick, 240)
        shown = serving()  # what the Agents pane's title shows (the plane's kv row)
    finally:
        if runner is not None and runner.poll() is None:
            runner.kill()
        plane.stop()
        store.close()

    assert shown == {"run": "demo", "state": "serving", "step": last, "detail": f"serving {final}"}
    updates = audit(home, "model_update")
    steps = [u["step"] for u in updates]
    assert steps == sorted(set(steps)) and steps[-1] == last and len(steps) >= 2  # each checkpoint, in order
    assert all(u["run"] == "demo" and u["weights"] == "full" and u["digest"] for u in updates)
    assert [u["model_version"] for u in updates] == [f"demo-v{s:04d}" for s in steps]

    rollouts = audit(home, "rollout")
    start = [r["verifier_score"] for r in rollouts if r["model_version"] == "base"]
    end = [r["verifier_score"] for r in rollouts if r["model_version"] == final]
    print(f"mean verifier: base {mean(start):.3f} over {len(start)}, {final} {mean(end):.3f} over {len(end)}")
    assert start and end and mean(end) > mean(start) + 0.3


# -- `carl agents up --serve-run` -------------------------------------------------------------------


def saved_weights(path: Path) -> Path:
    """A directory a run's checkpoint could be: a config and a safetensors file (what the follower looks
    for)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * 8)
    return path


def test_a_running_run_is_followed_checkpoint_by_checkpoint_and_a_finished_one_is_served_its_final(
    home: Path, tmp_path: Path
) -> None:
    out = tmp_path / "mine"
    with Store(home / "carl.db") as store:
        run_id = store.create_run("mine", source_kind="carl", model="carl-tiny")
        store.update_run(run_id, output_dir=str(out))
        follower = RunFollower("mine", home, served_model="carl-tiny")
        assert follower.next_weights(store) is None
        assert follower.describe() == {
            "run": "mine",
            "state": "waiting",
            "step": None,
            "detail": "run mine has no checkpoint yet",
        }

        store.add_event(run_id, 10, "checkpoint", str(saved_weights(out / "checkpoint-10")))
        first = follower.next_weights(store)
        assert first is not None and (first.step, first.kind, first.final) == (10, "full", False)
        assert first.version == "mine-v0010" and first.path == out / "checkpoint-10"
        follower.announced(
            ModelUpdateEvent(
                model_version=first.version, checkpoint_path=str(first.path), base_model="x", step=10
            )
        )
        assert follower.next_weights(store) is None  # nothing newer than what was announced
        assert follower.describe()["detail"] == "serving mine-v0010"

        store.add_event(run_id, 20, "checkpoint", str(out / "checkpoint-20"))  # rotated away already
        assert follower.next_weights(store) is None
        store.add_event(run_id, 20, "final", str(saved_weights(out / "final")))
        store.update_run(run_id, status="finished")
        last = follower.next_weights(store)
        assert last is not None and last.final and (last.step, last.path) == (20, out / "final")

        # `carl agents up --serve-run mine` after the run ended: its final model at once.
        late = RunFollower("mine", home, served_model="carl-tiny").next_weights(store)
        assert late is not None and late.final and late.path == out / "final"
        # The workers serve another model than the run trained: refused, and said so.
        other = RunFollower("mine", home, served_model="Qwen/Qwen2.5-0.5B")
        assert other.next_weights(store) is None
        assert other.describe()["state"] == "refused"
        assert (
            other.describe()["detail"] == "run mine trains carl-tiny, but the workers serve Qwen/Qwen2.5-0.5B"
        )


def carl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "CARL_HOME": str(home)},
        timeout=120,
        check=False,
    )


def test_serve_run_is_checked_before_the_engine_is_asked(home: Path) -> None:
    missing = carl(home, "agents", "up", "--serve-run", "nosuch")
    assert missing.returncode != 0 and missing.stderr.strip().count("\n") == 0
    assert "--serve-run nosuch: no such run" in missing.stderr
    with Store(home / "carl.db") as store:
        store.create_run("observed", source_kind="trackio")
    observed = carl(home, "agents", "up", "--serve-run", "observed")
    assert "was not trained by carl" in observed.stderr and observed.stderr.strip().count("\n") == 0
    with Store(home / "carl.db") as store:
        store.create_run("mine", source_kind="carl", model="carl-tiny")
    training = carl(home, "agents", "up", "--serve-run", "mine", "--train")
    assert "--serve-run mine with --train" in training.stderr and training.stderr.strip().count("\n") == 0
    assert not (home / "engine.pid").exists()  # nothing was started
