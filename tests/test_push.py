"""`carl push`: a run's model and its card reach a Hub through the real huggingface_hub, talking
to a local stand-in (tests/hub_server.py) that keeps every byte it receives.

The files arrive byte-identical in one commit (the weights through LFS), the card tells what the
run did, training state is never uploaded, the token goes to the Hub only, and every failure
(bad token, no token, no model, bad repo id, a run that is not carl's or still running, a Hub
that refuses or cannot be reached) is one line with exit status 2 (or 1), never a traceback.

hf_xet is installed here, and with it huggingface_hub uploads large files through xet storage
only (the LFS batch answer cannot steer it). Xet speaks its own CAS protocol, so these tests turn
it off with HF_HUB_DISABLE_XET, huggingface_hub's documented switch: large files then take the
LFS "basic" transfer (batch, PUT, verify), which the stand-in serves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import yaml
from hub_server import HubServer

from engine.store import Store, StoreReader
from engine.training.push import add_push_arguments, model_card, push_from_args

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "hf_carl_test_token_0123456789"
USER = "alice"
TRAINING_STATE = {
    "optimizer.pt": b"adam moments",
    "scheduler.pt": b"lr",
    "trainer_state.json": b"{}",
    "training_args.bin": b"args",
    "rng_state.pth": b"rng",
    "carl_gate.json": b"{}",
}
CONFIG = {
    "name": "pushme",
    "model": "carl-tiny",
    "method": "grpo",
    "max_steps": 6,
    "learning_rate": 0.001,
    "sft_warmup_steps": 2,
    "aggregation": "normalize_then_sum",
    "rewards": [
        {"name": "task", "weight": 1.0},
        {"name": "format", "weight": 0.5},
        {"name": "coherence", "weight": 0.25},
    ],
}


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _isolated_hub(hub_env: None) -> None:
    """Every test here runs with huggingface_hub kept off the network (conftest's hub_env)."""


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer({TOKEN: USER, "hf_other_user_token_987": "bob"}) as server:
        yield server


@pytest.fixture(scope="module")
def adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real peft LoRA adapter of the tiny model, as trained from a Hub base model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("adapter")
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "carl-org/tiny-base"
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    assert (out / "README.md").is_file(), "peft writes a card of its own"
    return out


def make_run(
    home: Path,
    model: Path | None,
    *,
    name: str = "pushme",
    save: str = "final",
    source_kind: str = "carl",
    status: str = "finished",
    pid: int | None = None,
    evaluated: bool = True,
) -> Path:
    """A run as the runner leaves it: its model saved under output_dir/`save`, metrics, an eval."""
    output_dir = home / "runs" / name
    output_dir.mkdir(parents=True)
    if model is not None:
        shutil.copytree(model, output_dir / save)
    with Store(home / "carl.db") as store:
        run_id = store.create_run(
            name, source_kind=source_kind, status=status, config=CONFIG, model="carl-tiny", max_steps=8
        )
        store.update_run(run_id, output_dir=str(output_dir), last_step=8, pid=pid)
        store.add_metrics(run_id, [(s, "reward", 0.1 * s, 1.0) for s in range(1, 9)])
        store.add_metrics(
            run_id,
            [
                (8, "rewards/task/mean", 0.625, 1.0),
                (8, "phi/mean", 0.4321, 1.0),
                (8, "phi/entropy", 1.75, 1.0),
            ],
        )
        if evaluated:
            store.add_eval(
                run_id,
                False,
                {
                    "prompts": 16,
                    "step": 8,
                    "task": 0.3125,
                    "format": 0.9,
                    "model_dir": str(output_dir / "final"),
                },
                ["task 0.3125 < 0.5", "format 0.9 >= 0.8"],
            )
    return output_dir


@pytest.fixture
def carl_push(capsys: pytest.CaptureFixture[str]) -> Any:
    """`carl push` in this process: (exit status, stdout, stderr)."""

    def run(
        home: Path,
        endpoint: str,
        *argv: str,
        token: str | None = TOKEN,
        repo: str = "alice/tiny",
        ref: str = "pushme",
    ) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser()
        add_push_arguments(parser)
        flags = ["--home", str(home), "--endpoint", endpoint, *(["--token", token] if token else [])]
        code = push_from_args(parser.parse_args([ref, repo, *flags, *argv]))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def one_error(err: str) -> str:
    """stderr of a failed push: carl's lines only, the last one the error, and no traceback."""
    lines = err.splitlines()
    assert "Traceback" not in err
    assert 1 <= len(lines) <= 2 and all(line.startswith("carl push: ") for line in lines), err
    return lines[-1].removeprefix("carl push: ")


# -- a push ----------------------------------------------------------------------------------


def test_the_model_and_its_card_arrive_byte_identical_in_one_commit(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any
) -> None:
    output_dir = make_run(tmp_path, tiny_model)
    # An older checkpoint with other weights and its training state: final/ is what gets pushed.
    checkpoint = output_dir / "checkpoint-4"
    shutil.copytree(tiny_model, checkpoint)
    (checkpoint / "model.safetensors").write_bytes(b"older weights")
    for name, data in TRAINING_STATE.items():
        (checkpoint / name).write_bytes(data)

    code, out, err = carl_push(tmp_path, hub.url)

    assert code == 0, err
    final = output_dir / "final"
    expected = {f.name: f.read_bytes() for f in final.iterdir()}
    size = sum(len(data) for data in expected.values()) / 1e6
    assert err == f"carl push: {len(expected)} files ({size:.1f} MB) from {final} to alice/tiny\n"
    repo = hub.repos["alice/tiny"]
    assert out == f"{hub.url}/alice/tiny/commit/{repo.heads['main']}\n"
    files = repo.files()
    assert {k: v for k, v in files.items() if k not in ("README.md", ".gitattributes")} == expected
    assert not set(TRAINING_STATE) & set(files)
    assert len(repo.commits) == 1 and sorted(repo.commits[0].paths) == sorted([*expected, "README.md"])
    assert repo.commits[0].summary == "carl: run pushme (final, step 8)"
    assert not repo.private
    # The weights took the LFS basic transfer; the small files went inline in the commit.
    assert [p for p in hub.paths("PUT")] == [f"/lfs-upload/{_sha256(expected['model.safetensors'])}"]
    assert hub.lfs == {_sha256(expected["model.safetensors"]): expected["model.safetensors"]}
    assert "/alice/tiny.git/info/lfs/objects/batch" in hub.paths("POST")
    # The token went to the Hub's API, and only there (the object store's PUT is presigned).
    for request in hub.requests:
        wanted = None if request.method == "PUT" else f"Bearer {TOKEN}"
        assert request.headers.get("authorization") == wanted, request.path
    assert TOKEN not in out + err
    assert not any(TOKEN.encode() in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    # What was pushed loads as a model.
    pulled = tmp_path / "pulled"
    pulled.mkdir()
    for name, data in files.items():
        (pulled / name).write_bytes(data)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(pulled).config.vocab_size == 512


def test_the_card_tells_what_the_run_did(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any
) -> None:
    make_run(tmp_path, tiny_model)
    assert carl_push(tmp_path, hub.url)[0] == 0
    card = hub.repos["alice/tiny"].files()["README.md"].decode()

    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta == {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["carl", "grpo", "coherence"],
    }
    body = card.split("---\n", 2)[2]
    assert "# pushme" in body and "`pushme` (id 1, finished)" in body
    assert "| method | GRPO, after 2 SFT warm-up steps |" in body
    assert "| steps | 8 of 8 |" in body and "carl-tiny" in body
    assert "| `task` | 1 |" in body and "| `format` | 0.5 |" in body and "| `coherence` | 0.25 |" in body
    assert "gated by carl's cascade" in body
    assert "| `reward` | total reward | 0.8 | 8 |" in body
    assert "| `rewards/task/mean` | task reward | 0.625 | 8 |" in body
    assert "| `phi/mean` | mean Phi (coherence) | 0.4321 | 8 |" in body
    assert "| `phi/entropy` | mean entropy | 1.75 | 8 |" in body
    assert "evaluation **failed** (weights of `final/`)" in body
    assert "| `task` | 0.3125 |" in body and "- task 0.3125 < 0.5" in body and "model_dir" not in body
    assert 'AutoModelForCausalLM.from_pretrained("alice/tiny")' in body
    assert str(tmp_path) not in card  # no local paths


def test_an_adapter_is_pushed_with_a_card_naming_its_base_model(
    tmp_path: Path, hub: HubServer, adapter: Path, carl_push: Any
) -> None:
    output_dir = make_run(tmp_path, adapter)
    assert carl_push(tmp_path, hub.url)[0] == 0
    files = hub.repos["alice/tiny"].files()
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json"):
        assert files[name] == (output_dir / "final" / name).read_bytes()
    card = files["README.md"].decode()
    assert card != (output_dir / "final" / "README.md").read_text(), "our card replaces peft's"
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "peft" and meta["base_model"] == "carl-org/tiny-base"
    assert meta["tags"] == ["carl", "grpo", "coherence", "lora"]
    assert "A LoRA adapter" in card and "r=4, alpha=8" in card
    assert 'AutoPeftModelForCausalLM.from_pretrained("alice/tiny")' in card


def test_a_card_without_eval_or_metrics_and_a_local_base_says_so(tmp_path: Path, adapter: Path) -> None:
    local = tmp_path / "adapter"
    shutil.copytree(adapter, local)
    config = json.loads((local / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path)  # a local directory, not a Hub id
    (local / "adapter_config.json").write_text(json.dumps(config))
    with Store(tmp_path / "carl.db") as store:
        run_id = store.create_run("bare", source_kind="carl", status="stopped", config={"method": "sft"})
        run = store.run(run_id)
    reader = StoreReader(tmp_path / "carl.db")
    try:
        card = model_card(run or {}, reader, local, repo="alice/bare")
    finally:
        reader.close()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert "base_model" not in meta and meta["tags"] == ["carl", "sft", "coherence", "lora"]
    assert "Not evaluated" in card and "recorded none" in card and "## Rewards" not in card
    assert "base model is not on the Hub" in card and str(tmp_path) not in card
    # A full model fine-tuned from a Hub model names it as its base too.
    reader = StoreReader(tmp_path / "carl.db")
    try:
        card = model_card({**(run or {}), "model": "someorg/base-1b"}, reader, adapter.parent / "nothing")
    finally:
        reader.close()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "transformers" and meta["base_model"] == "someorg/base-1b"
    assert "[someorg/base-1b](https://huggingface.co/someorg/base-1b)" in card


def test_a_checkpoint_is_pushed_without_its_training_state(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any
) -> None:
    output_dir = make_run(tmp_path, tiny_model, save="checkpoint-3", status="stopped")
    for name, data in TRAINING_STATE.items():
        (output_dir / "checkpoint-3" / name).write_bytes(data)
    assert carl_push(tmp_path, hub.url)[0] == 0
    repo = hub.repos["alice/tiny"]
    assert not set(TRAINING_STATE) & set(repo.files())
    assert repo.files()["model.safetensors"] == (tiny_model / "model.safetensors").read_bytes()
    assert "| weights | `checkpoint-3/` |" in repo.files()["README.md"].decode()
    assert "not the `checkpoint-3/` pushed here" in repo.files()["README.md"].decode()


def test_a_branch_a_private_repo_and_a_second_push(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any
) -> None:
    make_run(tmp_path, tiny_model)
    code, out, _ = carl_push(tmp_path, hub.url, "--private", "--revision", "exp", "-m", "first try")
    assert code == 0
    repo = hub.repos["alice/tiny"]
    assert repo.private and set(repo.files("main")) == {".gitattributes"}
    assert "model.safetensors" in repo.files("exp") and repo.commits[0].summary == "first try"
    # Pushing the same run again changes nothing: huggingface_hub skips unchanged files.
    puts = len(hub.paths("PUT"))
    code, again, _ = carl_push(tmp_path, hub.url, "--revision", "exp")
    assert code == 0 and again == out
    assert len(repo.commits) == 1 and len(hub.paths("PUT")) == puts


def test_the_token_comes_from_hf_token_or_the_stored_login(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    make_run(tmp_path, tiny_model)
    token_file = Path(constants.HF_TOKEN_PATH)
    token_file.parent.mkdir(parents=True)
    token_file.write_text("hf_other_user_token_987")  # `hf auth login` as bob
    assert carl_push(tmp_path, hub.url, token=None, repo="bob/tiny")[0] == 0
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # $HF_TOKEN wins over the stored login
    assert carl_push(tmp_path, hub.url, token=None, repo="alice/tiny")[0] == 0
    assert set(hub.repos) == {"bob/tiny", "alice/tiny"}


# -- failures: one line each -----------------------------------------------------------------


def test_a_wrong_token_is_one_line_from_the_carl_command(
    tmp_path: Path, hub: HubServer, tiny_model: Path
) -> None:
    make_run(tmp_path, tiny_model)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "TRANSFORMERS_OFF"))}
    env.update(
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HOME=str(tmp_path / "hf-home"),
        HF_ENDPOINT=hub.url,
    )
    argv = [
        sys.executable,
        "-m",
        "engine.cli",
        "--home",
        str(tmp_path),
        "push",
        "pushme",
        "alice/tiny",
        "--token",
        "hf_wrong_token_000",
    ]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert one_error(done.stderr).startswith("the hub refused the token (401 Unauthorized)")
    assert "hf_wrong_token_000" not in done.stderr
    # create_repo(exist_ok=True) looked for the repo after the 401, then gave up: nothing was made.
    assert hub.paths() == ["/api/repos/create", "/api/models/alice/tiny"] and hub.repos == {}


def test_no_token_anywhere_is_one_line(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any
) -> None:
    make_run(tmp_path, tiny_model)
    code, out, err = carl_push(tmp_path, hub.url, token=None)
    assert code == 2 and out == ""
    assert (
        one_error(err) == "no Hugging Face token: pass --token, set HF_TOKEN, or log in with `hf auth login`"
    )
    assert hub.requests == []


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ({"model": None}, "run 'pushme' has no saved model yet (no final/ or checkpoint-* in"),
        (
            {"source_kind": "trackio"},
            "run 'pushme' was not trained by carl (it is trackio): no model to push",
        ),
        (
            {"status": "running", "pid": "this process"},
            "run 'pushme' is still running (pid {pid}): push it",
        ),
        ({"status": "paused", "pid": None}, "run 'pushme' is still paused: push it once it has finished"),
    ],
    ids=["no-model", "not-carl", "running", "paused"],  # the same on every worker (no pid in a test's id)
)
def test_a_run_that_cannot_be_pushed_is_one_line(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any, setup: dict[str, Any], message: str
) -> None:
    settings = dict(setup)  # parametrize shares the dict between runs
    if settings.get("pid") == "this process":
        settings["pid"] = os.getpid()
    make_run(tmp_path, settings.pop("model", tiny_model), **settings)
    code, out, err = carl_push(tmp_path, hub.url)
    assert code == 2 and out == ""
    assert one_error(err).startswith(message.format(pid=os.getpid()))
    assert hub.requests == []


def test_a_stale_running_run_is_pushed_and_an_unknown_one_is_not(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its run says "running", but the process died (kill -9): the checkpoint is final
    make_run(tmp_path, tiny_model, save="checkpoint-8", status="running", pid=gone.pid)
    assert carl_push(tmp_path, hub.url)[0] == 0
    code, _, err = carl_push(tmp_path, hub.url, ref="nope")
    assert code == 2 and one_error(err) == "nope: no such run"


@pytest.mark.parametrize(
    "repo",
    [
        "tiny",
        "alice/tiny/x",
        ".alice/tiny",
        "alice/ti--ny",
        "alice/tiny.git",
        "alice/",
        "alice/t y",
        "alice/" + "x" * 97,
    ],
)
def test_a_bad_repo_id_is_refused_before_anything_else(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any, repo: str
) -> None:
    make_run(tmp_path, tiny_model)
    code, _, err = carl_push(tmp_path, hub.url, repo=repo)
    assert code == 2
    assert one_error(err).startswith(f"repo {repo!r}")
    assert hub.requests == []


@pytest.mark.parametrize(
    ("fail", "code", "message"),
    [
        (None, 2, "the token may not write to bob/tiny (403 Forbidden): it needs write access to 'bob'"),
        (
            (409, "/commit/", "A commit has happened since"),
            2,
            "bob/tiny: the hub reports a conflict (409 Conflict): A commit has happened since",
        ),
        (
            (500, "/commit/", "database on fire"),
            1,
            "the hub failed (500 Internal Server Error): database on fire: try again later",
        ),
        ((404, "/preupload/", "gone"), 2, "bob/tiny: not found on the hub (404 Not Found): gone"),
        (
            (400, "/lfs-upload/", "checksum mismatch"),
            2,  # huggingface_hub wraps this one in a RuntimeError
            "the hub rejected the push to bob/tiny (400 Bad Request): checksum mismatch",
        ),
        (
            (413, "/lfs/objects/batch", "too big"),
            2,
            f"the hub rejected the push to bob/tiny (413 {HTTPStatus(413).phrase}): too big",
        ),
    ],
)
def test_a_hub_that_refuses_is_one_line(
    tmp_path: Path,
    hub: HubServer,
    tiny_model: Path,
    carl_push: Any,
    fail: tuple[int, str, str] | None,
    code: int,
    message: str,
) -> None:
    make_run(tmp_path, tiny_model)
    hub.orgs["bob"] = {USER} if fail else set()  # without a failure: alice may not write to bob's repos
    if fail:
        hub.fail_next(*fail)
    got, out, err = carl_push(tmp_path, hub.url, repo="bob/tiny")
    assert (got, out) == (code, "")
    assert one_error(err) == message


def test_an_unreachable_hub_or_offline_mode_is_one_line(
    tmp_path: Path, tiny_model: Path, carl_push: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_run(tmp_path, tiny_model)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    code, _, err = carl_push(tmp_path, closed)
    assert code == 1 and one_error(err).startswith(f"cannot reach the hub at {closed}: ConnectError:")
    code, _, err = carl_push(tmp_path, "ftp://hub")
    assert code == 2 and one_error(err).startswith("endpoint 'ftp://hub' (--endpoint or $HF_ENDPOINT)")
    code, _, err = carl_push(tmp_path / "elsewhere", closed)
    assert code == 2 and one_error(err) == f"{tmp_path / 'elsewhere' / 'carl.db'}: no carl database here"
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    code, _, err = carl_push(tmp_path, closed)
    assert code == 2 and one_error(err) == "HF_HUB_OFFLINE is set: unset it to push"


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_with_hf_xet_a_hub_without_xet_storage_is_one_line_naming_the_switch(
    tmp_path: Path, hub: HubServer, tiny_model: Path, carl_push: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where hf_xet is installed and not switched off, large files go through xet only: the
    stand-in serves no xet, so the push fails, in one line that names HF_HUB_DISABLE_XET."""
    pytest.importorskip("hf_xet")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    monkeypatch.delenv("HF_HUB_DISABLE_XET")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # hf_xet writes its logs under it
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "hf-home" / "xet"))
    make_run(tmp_path, tiny_model)
    code, _, err = carl_push(tmp_path, hub.url)
    assert code == 1
    message = one_error(err)
    assert message.startswith(f"the xet upload to {hub.url} failed: ") and "HF_HUB_DISABLE_XET=1" in message
    assert "/api/models/alice/tiny/xet-write-token/main" in hub.paths("GET")
    assert "/lfs/objects/batch" not in " ".join(hub.paths())
    assert not any(TOKEN.encode() in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
