"""Fixtures shared by the test files: a real store in a temporary directory, and a local server that
speaks the Anthropic Messages API (tests/messages_server.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from messages_server import MessagesServer

from engine.store import Store


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
