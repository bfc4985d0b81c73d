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


@pytest.fixture
def server() -> Iterator[MessagesServer]:
    with MessagesServer() as s:
        yield s
