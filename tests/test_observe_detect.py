"""Telling formats apart, and the one-line errors for paths that are none of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.observe import ObserveError, detect_kind, ingest_source, observe, register_source
from engine.store import Store


def state_json(entries: list[dict]) -> str:
    return json.dumps({"global_step": 1, "max_steps": 10, "log_history": entries}, indent=2)


def test_jsonl_by_name_or_content(tmp_path: Path) -> None:
    named = tmp_path / "empty.jsonl"
    named.write_text("")
    assert detect_kind(named) == "jsonl"  # a log about to be written
    sniffed = tmp_path / "train.log"
    sniffed.write_text('\n{"step": 1, "loss": 2.0}\nnot json\n')
    assert detect_kind(sniffed) == "jsonl"


def test_trainer_state_by_name_content_or_dir(tmp_path: Path) -> None:
    state = tmp_path / "trainer_state.json"
    state.write_text(state_json([{"loss": 1.0, "step": 1}]))
    assert detect_kind(state) == "trainer_state"
    renamed = tmp_path / "saved.json"
    renamed.write_text(state_json([]))
    assert detect_kind(renamed) == "trainer_state"
    assert detect_kind(tmp_path) == "trainer_state"
    nested = tmp_path / "out"
    (nested / "checkpoint-5").mkdir(parents=True)
    (nested / "checkpoint-5" / "trainer_state.json").write_text(state_json([]))
    assert detect_kind(nested) == "trainer_state"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.jsonl", None, r"missing\.jsonl: no such file or directory"),
        ("blank.txt", b"  \n", r"blank\.txt: the file is empty"),
        ("data.bin", b"\x00\x01\x02garbage", r"data\.bin: not a Trackio project database, a trainer_state"),
        ("config.json", b'{\n  "lr": 0.1\n}\n', r"config\.json: not a Trackio project database"),
        ("fake.db", b"SQLite format 3\x00" + b"\x00" * 200, r"fake\.db: "),
    ],
)
def test_unknown_paths_raise_one_line_errors(
    tmp_path: Path, name: str, content: bytes | None, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ObserveError, match=message) as err:
        detect_kind(path)
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_directory_without_a_trainer_state(tmp_path: Path) -> None:
    with pytest.raises(ObserveError, match=r"a directory with no trainer_state\.json"):
        detect_kind(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "secret.jsonl"
    path.write_text('{"step": 1, "a": 1}\n')
    path.chmod(0)
    with pytest.raises(ObserveError, match=r"secret\.jsonl: cannot read it \(Permission denied\)"):
        detect_kind(path)


def test_register_resolves_the_path_and_keeps_one_source(store: Store, tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "a": 1}\n')
    monkeypatch.chdir(tmp_path)
    source_id = register_source(store, "m.jsonl", follow=False)
    assert store.source(source_id)["path"] == str(path.resolve())
    assert register_source(store, path, follow=True, name="n") == source_id
    source = store.source(source_id)
    assert source["follow"] == 1 and source["name"] == "n" and source["state"] == "following"


def test_register_with_a_kind_and_attach_to(store: Store, tmp_path: Path) -> None:
    """Discovery names the kind (a rollouts folder has no kind detect_kind tells) and the source it joins."""
    log = tmp_path / "m.jsonl"
    log.write_text('{"step": 1, "a": 1}\n')
    dumps = tmp_path / "rollouts"
    dumps.mkdir()
    main = register_source(store, log, follow=False)
    joined = register_source(store, dumps, follow=True, kind="rollouts-verl", attach_to=main)
    assert (store.source(joined)["kind"], store.source(joined)["attach_to"]) == ("rollouts-verl", main)
    assert store.source(main)["attach_to"] is None
    assert register_source(store, dumps, follow=True, kind="rollouts-verl") == joined  # attach_to kept
    assert store.source(joined)["attach_to"] == main
    with pytest.raises(ObserveError, match="was observed as rollouts-verl but now looks like rollouts-prime"):
        register_source(store, dumps, follow=True, kind="rollouts-prime")


def test_a_path_that_changed_format_is_refused(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "metrics.log"
    path.write_text('{"step": 1, "a": 1}\n')
    observe(store, path)
    path.write_text(state_json([{"loss": 1.0, "step": 1}]))
    with pytest.raises(
        ObserveError, match=r"metrics\.log: was observed as jsonl but now looks like trainer_state"
    ):
        register_source(store, path, follow=False)


def test_a_trainer_state_without_log_history_is_an_error(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(state_json([]))
    source_id, _ = observe(store, path, follow=True)
    path.write_text(json.dumps({"log_history": "nope"}))
    with pytest.raises(
        ObserveError, match=r"trainer_state\.json: not a trainer_state\.json \(no log_history list\)"
    ):
        ingest_source(store, source_id)
    source = store.source(source_id)
    assert source["state"] == "error" and "no log_history" in source["last_error"]
    assert store.followed_sources() == []


def test_unknown_source_id(store: Store) -> None:
    with pytest.raises(ObserveError, match="no source with id 42"):
        ingest_source(store, 42)


def test_progress_is_reported(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": i, "a": i}) + "\n" for i in range(100)))
    seen: list[tuple[int, int | None]] = []
    observe(store, path, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1] == (path.stat().st_size, path.stat().st_size)
