"""Fixtures shared by the test files: a real store in a temporary directory, and a local server that
speaks the Anthropic Messages API (tests/messages_server.py); every test's temporary files in its own
folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from messages_server import MessagesServer

from engine.store import Store


def pytest_configure(config: pytest.Config) -> None:
    """The session's (each xdist worker's) temporary files in a folder of its own, removed when it ends: what
    a package makes when it is imported (wandb's `wandb-media`, `wandb-artifacts`), before any test runs."""
    folder = tempfile.mkdtemp(prefix="carl-tests-")
    config.stash[SESSION_TEMP] = folder
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(SESSION_TEMP, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


SESSION_TEMP = pytest.StashKey[str]()


@pytest.fixture(autouse=True)
def own_temp_folder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The system temp folder of each test, and of every process it starts, is one of its own (removed with
    the session's, as a module's fixtures may keep using what they made in it): torchrun's `torchelastic_*`
    folders and wandb's `wandb-media` and `wandb-artifacts` ones no longer pile up in /tmp (issue 30 §13). Its
    path stays short (`/tmp/carl-tests-XXXXXXXX/tXXXXXXXX`): Chromium makes its singleton socket under it, and
    a Unix socket's path is at most 107 bytes (under pytest's deep per-test folders Chromium aborted: "Socket
    path too long")."""
    folder = tempfile.mkdtemp(prefix="t", dir=request.config.stash[SESSION_TEMP])
    monkeypatch.setenv("TMPDIR", folder)
    monkeypatch.setattr(tempfile, "tempdir", folder)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "carl.db") as s:
        yield s


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in tiny model, built once for the session (tests copy it, never change it)."""
    from engine.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.getbasetemp() / "carl-tiny")


@pytest.fixture
def tiny_home(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A $CARL_HOME holding the tiny model where carl looks for it, offline."""
    import shutil

    from engine.models.tiny import default_model_dir

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shutil.copytree(tiny_model, default_model_dir(tmp_path))
    return tmp_path


@pytest.fixture
def server() -> Iterator[MessagesServer]:
    with MessagesServer() as s:
        yield s


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Nothing reaches huggingface.co, no login of this machine is used, xet is off.

    huggingface_hub reads its settings from the environment when first imported (maybe by an
    earlier test file, with HF_HUB_OFFLINE=1), so its constants are patched as well."""
    from huggingface_hub import constants
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_OIDC_RESOURCE",
        "HF_ENDPOINT",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # a fallback would fail, not leak
    disable_progress_bars()  # stderr holds carl's lines only
    yield
    enable_progress_bars()
