"""The box sampled: this machine through psutil (and NVML where there is a GPU), stored as a node's series,
bounded, read back; a node's sample from outside checked field by field; the engine's job on a real daemon."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

from engine import paths
from engine.control import start_engine, stop_engine
from engine.store import Store, StoreReader
from engine.store.system import RAW_MAX_PER_SERIES
from engine.system import BadSample, Sampler, from_json
from engine.system.nvml import Nvml
from engine.system.system_settings import load_system_settings


def test_a_sample_of_this_machine_has_cpu_memory_and_the_disk_of_a_watched_path(tmp_path: Path) -> None:
    sampler = Sampler()
    sampler.watch([tmp_path])
    sample = sampler.sample()
    scalars = sample.scalars()
    assert 0.0 <= scalars["cpu/percent"] <= 100.0
    assert scalars["mem/total"] > scalars["mem/used"] > 0
    assert len(sample.cores) >= 1 and len(sample.load) == 3
    [disk] = sample.disks
    assert str(tmp_path) in disk.paths and 0 < disk.free <= disk.total
    assert scalars[f"disk/free:{disk.mount}"] == disk.free
    json.dumps(sample.to_json(), allow_nan=False)  # what system_now and NATS carry


def test_without_an_nvidia_driver_nvml_is_one_line_and_the_rest_is_sampled() -> None:
    nvml = Nvml().open()
    if nvml.count:
        pytest.skip("this machine has an NVIDIA GPU (bench/gpu_check.sh checks NVML there)")
    assert nvml.note is not None and nvml.note.startswith("no NVIDIA GPU: ")
    assert "\n" not in nvml.note
    sample = Sampler(nvml).sample()
    assert sample.gpus == [] and sample.notes == [nvml.note]
    assert sample.cpu is not None


def test_samples_are_stored_as_series_read_raw_or_rolled_up_and_thinned_never_the_newest(
    store: Store,
) -> None:
    node = store.system.node("box", host="box", via="local")
    t0 = 1_700_000_000.0
    for i in range(RAW_MAX_PER_SERIES + 50):
        store.system.add_sample(node, t0 + 2 * i, {"cpu/percent": float(i % 100)}, {"t": t0 + 2 * i})
    newest = t0 + 2 * (RAW_MAX_PER_SERIES + 49)
    assert store.system.thin() >= 50
    reader = StoreReader(store.path)
    try:
        recent = reader.system.series(node, "cpu/percent", newest - 60, newest)
        assert recent.width == 0 and len(recent) == 31 and recent.t[-1] == newest
        day = reader.system.series(node, "cpu/percent", t0, newest, max_points=500)
        assert day.width == 60 and len(day) <= 500 and day.t[-1] == newest
        assert min(day.vmin) == 0.0 and max(day.vmax) == 99.0  # the rollups keep the extremes
        assert reader.system.now()[node] == {"t": newest}
        assert reader.system.keys(node) == ["cpu/percent"]
    finally:
        reader.close()
    count = store.conn.execute("SELECT count(*) FROM system_samples").fetchone()[0]
    assert count == RAW_MAX_PER_SERIES


def test_a_sample_from_another_node_is_checked_field_by_field() -> None:
    sample = Sampler().sample()
    good = sample.to_json()
    assert from_json(json.loads(json.dumps(good))).scalars() == sample.scalars()  # the round trip keeps it
    cases = {
        "cpu": ("nan", "cpu: expected a number"),
        "cores": ([5.0] * 5000, "cores: 5,000 entries, at most 4,096"),
        "gpus": ([{"index": 0, "util": 250.0}], "gpus[0].util: 250.0 is out of range"),
        "notes": (["x" * 1000], "notes[0]: 1,000 characters, at most 200"),
        "disks": ([{"mount": "/", "total": -1.0, "free": 0.0}], "disks[0].total: -1.0 is out of range"),
    }
    for field, (value, message) in cases.items():
        with pytest.raises(BadSample) as caught:
            from_json({**good, field: value})
        assert str(caught.value).startswith(message), (field, str(caught.value))
    with pytest.raises(BadSample, match="t: missing"):
        from_json({"cpu": 1.0})
    with pytest.raises(BadSample, match="a sample is an object"):
        from_json([1, 2])


def test_system_settings_say_each_bad_value_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "engine.toml").write_text('[system]\ninterval_s = 0.01\nenabled = "yes"\ncolour = 1\n')
    settings, problems = load_system_settings(tmp_path)
    assert settings.interval_s == 2.0 and settings.enabled
    assert problems == [
        "engine.toml: system.colour: unknown setting (known: interval_s, enabled, paths)",
        "engine.toml: system.interval_s: expected seconds from 0.1 (10 a second) to 3600; sampling every 2 s",
        "engine.toml: system.enabled: expected true or false",
    ]
    (tmp_path / "engine.toml").write_text("[system]\ninterval_s = 0.1\npaths = ['~/data']\n")
    settings, problems = load_system_settings(tmp_path)
    assert problems == [] and settings.interval_s == 0.1 and settings.paths == (str(Path.home() / "data"),)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "carl"
    home.mkdir()
    monkeypatch.setenv("CARL_HOME", str(home))
    yield home
    stop_engine(home, timeout=10.0)


@pytest.mark.slow
def test_the_engine_samples_this_machine_at_its_configured_interval(home: Path) -> None:
    (home / "engine.toml").write_text("[system]\ninterval_s = 0.2\n")
    start_engine(home)
    db = paths.db_path(home)

    def samples() -> int:
        reader = StoreReader(db)
        try:
            return int(
                reader.conn.execute("SELECT count(*) FROM system_samples WHERE key='cpu/percent'").fetchone()[
                    0
                ]
            )
        finally:
            reader.close()

    wait_for(lambda: samples() >= 5, what="five samples at 0.2 s")
    reader = StoreReader(db)
    try:
        [node] = reader.system.nodes()
        assert node["via"] == "local" and node["state"] == "live"
        now = reader.system.now()[node["id"]]
        assert any(str(home) in d["paths"] for d in now["disks"])
        times = [
            t
            for (t,) in reader.conn.execute(
                "SELECT t FROM system_samples WHERE key='cpu/percent' ORDER BY t DESC LIMIT 5"
            )
        ]
    finally:
        reader.close()
    gaps = [a - b for a, b in zip(times, times[1:], strict=False)]
    assert all(0.1 < gap < 2.0 for gap in gaps), gaps  # about 0.2 s apart (generous for a loaded machine)
    assert time.time() - times[0] < 30
