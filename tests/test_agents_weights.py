"""Weights travel over the plane: each version is put in a JetStream object store bucket; a worker with a
CARL_HOME of its own (no filesystem shared with the trainer) fetches it by name, checks the digest and
hot-swaps it; an http worker tells its OpenAI-compatible server to load the copy it fetched. A replaced
object, a damaged archive and an archive with anything but plain files are refused."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agents_support import address_of, jetstream, nats_server
from openai_server import OpenAIServer
from test_agents_plane import arithmetic_tasks, http_settings, solve
from test_agents_trainer import feed, make_trainer, sample_group

from engine.agents.bus import publish, resolve_address
from engine.agents.carl_agents import headless
from engine.agents.events import ControlEvent, ModelUpdateEvent
from engine.agents.launcher import child_argv, write_settings
from engine.agents.plane_settings import AgentsSettings
from engine.agents.policy import LocalPolicy
from engine.agents.server import token_path
from engine.agents.tasks import demo_tasks, load_tasks
from engine.agents.weights import (
    DIGEST_FILE,
    MODELS_BUCKET,
    WeightsError,
    fetch_weights,
    file_digest,
    models_bucket,
    publish_update,
    received_dir,
    unpack,
)
from engine.agents.worker import run_worker
from engine.models.tiny import default_model_dir
from engine.store import Store, StoreReader

pytestmark = pytest.mark.slow


def trained_adapter(home: Path) -> ModelUpdateEvent:
    """One adapter published by the plane's trainer after one optimizer step (on disk in `home`)."""
    with Store(home / "carl.db") as store:
        trainer = make_trainer(home, store, publish_every=1)
        worker = LocalPolicy.load("carl-tiny", home, seed=1)
        feed(
            trainer, sample_group(worker, "Say hello.", 4, seed=1) + sample_group(worker, "Count.", 4, seed=2)
        )
        update = trainer.step()
        trainer.close()
    assert update is not None
    return update


def spawn_worker(home: Path, settings: AgentsSettings, ident: str) -> subprocess.Popen[bytes]:
    """A model worker process whose CARL_HOME is `home`, joining the plane at `settings.url`."""
    argv = child_argv(
        "worker", home, write_settings(home, settings), resolve_address(settings), "--id", ident
    )
    (home / "logs").mkdir(parents=True, exist_ok=True)
    with (home / "logs" / f"{ident}.log").open("ab") as log:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        return subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)


async def test_a_worker_on_another_home_fetches_the_adapter_by_name_and_digest_and_serves_it(
    tmp_path: Path, tiny_home: Path
) -> None:
    trainer_home = tiny_home
    update = trained_adapter(trainer_home)
    worker_home = tmp_path / "far-away"
    shutil.copytree(default_model_dir(trainer_home), default_model_dir(worker_home))

    with nats_server(trainer_home) as server:
        nc, js = await jetstream(address_of(server), "trainer")
        announced = await publish_update(js, update)
        await nc.close()
        # The adapter leaves the trainer's disk: only the object store still has it.
        shutil.rmtree(update.checkpoint_path)
        assert announced.bucket == MODELS_BUCKET and announced.object_name == update.model_version
        assert announced.digest and announced.digest.startswith("SHA-256=") and announced.size

        settings = AgentsSettings(
            workers=0,
            worker_kind="model",
            max_new_tokens=12,
            ack_wait_s=60,
            url=server.url,
            token_file=str(token_path(trainer_home)),
        )
        worker = spawn_worker(worker_home, settings, "far")
        try:
            summary = await headless(trainer_home, settings, demo_tasks(), limit=3)
        finally:
            worker.terminate()
            worker.wait(30)
    assert summary["done"] == 3 and summary["model_versions"] == {update.model_version: 3}

    fetched = received_dir(worker_home, "far") / announced.digest.removeprefix("SHA-256=").rstrip("=")
    assert (fetched / "adapter_model.safetensors").is_file()
    assert (fetched / DIGEST_FILE).read_text().strip() == announced.digest
    assert not (trainer_home / "agents" / "received").exists()  # the trainer's home was never used for it

    # The worker served exactly the trained adapter: its behaviour log-probs are the trainer's policy's.
    reader = StoreReader(trainer_home / "carl.db")
    try:
        results = [json.loads(r["payload"]) for r in reader.agent_audit(kind="result")]
        statuses = [json.loads(r["payload"]) for r in reader.agent_audit(kind="worker_status", limit=None)]
    finally:
        reader.close()
    assert f"serving adapter {update.model_version}" in {s["detail"] for s in statuses}
    served = LocalPolicy.load("carl-tiny", worker_home, seed=0)
    served.swap_adapter(fetched, update.model_version, update.base_fingerprint)
    for result in results:
        again = served.score(result["prompt_token_ids"], result["response_token_ids"])
        assert np.abs(np.array(again) - np.array(result["token_logprobs"])).max() <= 1e-4


async def test_a_replaced_or_damaged_object_is_refused_and_nothing_is_unpacked(tmp_path: Path) -> None:
    weights = tmp_path / "adapter"
    weights.mkdir()
    (weights / "adapter_config.json").write_text("{}")
    (weights / "adapter_model.safetensors").write_bytes(b"\0" * 1000)
    update = ModelUpdateEvent(model_version="r-v0001", checkpoint_path=str(weights), base_model="tiny")
    worker_home = tmp_path / "worker"
    with nats_server(tmp_path / "home") as server:
        nc, js = await jetstream(address_of(server))
        announced = await publish_update(js, update)
        bucket = await models_bucket(js)
        await bucket.put("r-v0001", b"other bytes under the same name")
        with pytest.raises(WeightsError, match="holds other weights now"):
            await fetch_weights(js, announced, worker_home, "w1")
        missing = announced.model_copy(update={"object_name": "r-v0999"})
        with pytest.raises(WeightsError, match="no such object"):
            await fetch_weights(js, missing, worker_home, "w1")
        await nc.close()
    assert [p for p in received_dir(worker_home, "w1").iterdir()] == []


async def test_two_workers_of_one_home_fetching_one_update_at_once_keep_their_own_copy(
    tmp_path: Path,
) -> None:
    """The demo's plane runs two workers on one home. Both fetch each update at once; each must load files
    that nobody replaces under it. With one shared folder, the worker that unpacked second replaced the
    directory the first was loading from ("holds no .safetensors file"), and it served its old weights."""
    weights = tmp_path / "adapter"
    weights.mkdir()
    (weights / "adapter_config.json").write_text("{}")
    (weights / "adapter_model.safetensors").write_bytes(os.urandom(3 << 20))
    update = ModelUpdateEvent(model_version="demo-v0100", checkpoint_path=str(weights), base_model="tiny")
    home = tmp_path / "home"

    async def fetch_and_hold(js: Any, worker_id: str) -> tuple[Path, int]:
        """Fetch, then open the weights as a loader would: the file's identity at the moment it loads."""
        path = await fetch_weights(js, announced, home, worker_id)
        return path, os.stat(path / "adapter_model.safetensors").st_ino

    with nats_server(tmp_path / "plane") as server:
        nc, js = await jetstream(address_of(server))
        announced = await publish_update(js, update)
        # Both start before either has unpacked: both find no copy, and both fetch and unpack.
        fetched = await asyncio.gather(*(fetch_and_hold(js, w) for w in ("w1", "w2")))
        again = await fetch_weights(js, announced, home, "w1")  # already there: not fetched again
        await nc.close()
    sent = (weights / "adapter_model.safetensors").read_bytes()
    for path, inode in fetched:
        assert os.stat(path / "adapter_model.safetensors").st_ino == inode  # nothing replaced under a loader
        assert (path / "adapter_model.safetensors").read_bytes() == sent
        assert (path / DIGEST_FILE).read_text().strip() == announced.digest
    (one, _), (two, _) = fetched
    assert one != two and again == one
    assert sorted(p.name.split("-")[0] for p in (home / "agents" / "received").iterdir()) == ["w1", "w2"]


def test_unpacking_over_a_complete_copy_of_the_same_digest_leaves_it_in_place(tmp_path: Path) -> None:
    payload = tmp_path / "adapter_model.safetensors"
    payload.write_bytes(b"weights")
    archive = tmp_path / "w.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(payload, arcname=payload.name)
    digest = file_digest(archive)
    target = tmp_path / "out"
    unpack(archive, target, digest)
    inode = os.stat(target / payload.name).st_ino
    unpack(archive, target, digest)
    assert os.stat(target / payload.name).st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter_model.safetensors", "out", "w.tar"]


def test_an_archive_with_anything_but_plain_files_is_refused(tmp_path: Path) -> None:
    payload = tmp_path / "x"
    payload.write_text("x")
    for name, make in (
        ("../escape", lambda tar: tar.add(payload, arcname="../escape")),
        ("link", lambda tar: tar.addfile(_link("link", "/etc/passwd"))),
        ("sub/file", lambda tar: tar.add(payload, arcname="sub/file")),
    ):
        archive = tmp_path / f"{len(name)}.tar"
        with tarfile.open(archive, "w") as tar:
            make(tar)
        target = tmp_path / "out"
        with pytest.raises(WeightsError, match="not a plain file"):
            unpack(archive, target, file_digest(archive))
        assert not target.exists() and not (tmp_path / "escape").exists()


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


async def test_an_http_worker_has_its_server_load_the_adapter_it_fetched(tmp_path: Path) -> None:
    adapter = tmp_path / "trainer" / "agents-train-v0001"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"\1" * 100)
    home = tmp_path / "home"
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 2))
    with nats_server(home) as server, OpenAIServer(responder=solve) as llm:
        settings = http_settings(
            llm, workers=1, url=server.url, token_file=str(token_path(home)), endpoint_lora=True
        )
        nc, js = await jetstream(address_of(server), "trainer")
        update = ModelUpdateEvent(
            model_version="agents-train-v0001", checkpoint_path=str(adapter), base_model=llm.model
        )
        announced = await publish_update(js, update)
        await nc.close()
        shutil.rmtree(adapter.parent)
        summary = await asyncio.wait_for(headless(home, settings, specs, limit=None), 120)
        loads = [r.json for r in llm.requests if r.path == "/v1/load_lora_adapter"]
    [worker_dir] = (home / "agents" / "received").iterdir()  # the one worker's (headless: run<pid>-w1)
    fetched = worker_dir / str(announced.digest).removeprefix("SHA-256=").rstrip("=")
    assert loads == [{"lora_name": "agents-train-v0001", "lora_path": str(fetched)}]
    assert (fetched / "adapter_model.safetensors").read_bytes() == b"\1" * 100
    assert summary["model_versions"] == {"agents-train-v0001": 2}


@pytest.mark.parametrize("runtime_lora", [True, False], ids=["vllm-runtime-lora", "no-runtime-lora"])
async def test_an_http_worker_on_another_home_has_its_server_load_the_adapter_it_fetched(
    tmp_path: Path, runtime_lora: bool
) -> None:
    """The trainer's home and the worker's are two directories (two machines): the worker fetches the
    adapter into its own home and tells the server beside it to load that copy, by vLLM's
    `POST /v1/load_lora_adapter`; a server without runtime LoRA loading keeps serving its model and
    the worker says why, in one line, while answering every task."""
    trainer_home, worker_home = tmp_path / "trainer", tmp_path / "far-away"
    adapter = trainer_home / "runs" / "agents-train-v0003"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\2" * 300)
    specs = load_tasks(arithmetic_tasks(tmp_path / "tasks.jsonl", 3))
    with nats_server(trainer_home) as server, OpenAIServer(responder=solve, runtime_lora=runtime_lora) as llm:
        settings = http_settings(
            llm,
            workers=0,
            url=server.url,
            token_file=str(token_path(trainer_home)),
            endpoint_lora=True,
            ack_wait_s=60,
        )
        nc, js = await jetstream(address_of(server), "trainer")
        update = ModelUpdateEvent(
            model_version="agents-train-v0003", checkpoint_path=str(adapter), base_model=llm.model
        )
        announced = await publish_update(js, update)
        await nc.close()
        shutil.rmtree(adapter)  # only the object store has it now
        worker = spawn_worker(worker_home, settings, "far-http")
        try:
            summary = await asyncio.wait_for(headless(trainer_home, settings, specs, limit=3), 120)
        finally:
            worker.terminate()
            worker.wait(30)
        loads = [r for r in llm.requests if r.path == "/v1/load_lora_adapter"]
        asked = [r.json["model"] for r in llm.requests if r.path == "/v1/chat/completions"]
        endpoint = llm.base_url

    fetched = received_dir(worker_home, "far-http") / str(announced.digest).removeprefix("SHA-256=").rstrip(
        "="
    )
    assert (fetched / "adapter_model.safetensors").read_bytes() == b"\2" * 300
    assert not (trainer_home / "agents" / "received").exists()
    assert [r.json for r in loads] == [{"lora_name": "agents-train-v0003", "lora_path": str(fetched)}]
    reader = StoreReader(trainer_home / "carl.db")
    try:
        statuses = [json.loads(r["payload"]) for r in reader.agent_audit(kind="worker_status", limit=None)]
    finally:
        reader.close()
    details = [s.get("detail") or "" for s in statuses if s.get("worker_id") == "far-http"]
    served = "agents-train-v0003" if runtime_lora else llm.model
    assert summary["done"] == 3 and summary["model_versions"] == {served: 3}
    assert asked == [served] * 3
    if runtime_lora:
        assert llm.adapters == {"agents-train-v0003": str(fetched)}
        assert f"serving adapter agents-train-v0003 from {endpoint}" in details
    else:
        [refused] = [d for d in details if "agents-train-v0003" in d]
        assert refused.startswith(f"kept {llm.model}: ") and "\n" not in refused
        assert "no runtime LoRA loading" in refused and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in refused


async def test_an_adapter_load_the_server_failed_is_tried_again_and_a_refused_one_is_not(
    tmp_path: Path,
) -> None:
    """vLLM answers 500 when a load fails on its side: the worker keeps its model, says it will try again,
    and does (SWAP_RETRY_S) until the server loads the adapter. A refusal (a 4xx) is said once and not
    tried again: asking again would get the same answer."""
    trainer_home, worker_home = tmp_path / "trainer", tmp_path / "far-away"
    adapters = []
    for version in ("agents-train-v0001", "agents-train-v0002"):
        adapter = trainer_home / "runs" / version
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text('{"r": 4}')
        (adapter / "adapter_model.safetensors").write_bytes(b"\3" * 100)
        adapters.append(ModelUpdateEvent(model_version=version, checkpoint_path=str(adapter), base_model="m"))
    details: list[str] = []

    async def on_status(msg: Any) -> None:
        details.append(json.loads(msg.data).get("detail") or "")

    async def until(what: Callable[[], bool], why: str) -> None:
        deadline = asyncio.get_running_loop().time() + 30
        while not what():
            assert asyncio.get_running_loop().time() < deadline, why
            await asyncio.sleep(0.05)

    with nats_server(trainer_home) as server, OpenAIServer(responder=solve) as llm:
        settings = http_settings(llm, workers=0, endpoint_lora=True)
        nc, js = await jetstream(address_of(server), "trainer")
        await nc.subscribe("status.workers.w1", cb=on_status)
        llm.fail_loads(500)
        await publish_update(js, adapters[0])
        worker = asyncio.create_task(
            run_worker(address_of(server), settings, kind="http", home=worker_home, worker_id="w1")
        )
        try:
            await until(lambda: "agents-train-v0001" in llm.adapters, "the failed load was never tried again")
            llm.fail_loads(400)
            await publish_update(js, adapters[1])
            await until(lambda: any("agents-train-v0002" in d for d in details), "no word on the refusal")
            await publish(js, ControlEvent(action="stop_worker", target="w1"))
            await asyncio.wait_for(worker, 30)
        finally:
            worker.cancel()
            gc.unfreeze()  # run_worker set the collector as a worker process's
            await nc.close()
        loads = [r.json["lora_name"] for r in llm.requests if r.path == "/v1/load_lora_adapter"]

    assert loads == ["agents-train-v0001", "agents-train-v0001", "agents-train-v0002"]
    failed = next(d for d in details if "agents-train-v0001" in d)
    assert failed.startswith(f"kept {llm.model}: ") and "HTTP 500" in failed
    assert failed.endswith("(trying again in 2s)")
    assert any(d.startswith("serving adapter agents-train-v0001") for d in details)
    [refused] = [d for d in details if "agents-train-v0002" in d]
    assert "HTTP 400" in refused and "trying again" not in refused
