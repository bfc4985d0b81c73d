"""Redaction (engine/redact.py) where it runs, timed: no goal of its own, a share of the work it sits in.

It never runs in the hook (`carl hook` only spools a payload: bench_hook.py's p99 <= 10 ms is untouched); it
runs in the engine, once per payload as the spool moves into `hook_events`, once per prompt and key parameter
of an imported trajectory, and on each diagnosis request (the digest, every tool result, the history, the
question). Rows:
- hook payloads: bench_hook.py's burst (every event type, ~2 KB tool responses), each payload through
  `redact_value` as `ingest_spool` stores it; per-payload p50/p99, and its share of the whole
  `ingest_spool` tick (store, assembly, scoring) over the same payloads;
- a diagnosis turn: the history of 20 messages of ~2 KB and a question, as `Diagnoser` redacts them each turn;
- throughput on a 1 MB training log, and the worst of a set of hostile texts (100 KB of markers that start a
  pattern: every pattern is linear in the text);
- for comparison, detect-secrets' 27 plugins with their default filters on the same payloads, when it is
  importable (it is not a dependency:
  `PYTHONPATH=<a folder with detect-secrets> python bench/bench_redact.py`),
  and what it finds of the corpus (tests/secret_corpus.py).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_hook import session_payloads  # noqa: E402
from secret_corpus import INTACT, SECRETS  # noqa: E402

from engine.redact import redact, redact_value  # noqa: E402

PAYLOADS = 1_000
SESSIONS = 8


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def timed(fn: Callable[[Any], Any], values: list[Any]) -> list[float]:
    """Microseconds per call of `fn` on each value."""
    out = []
    for value in values:
        started = time.perf_counter()
        fn(value)
        out.append((time.perf_counter() - started) * 1e6)
    return out


def line(label: str, times_us: list[float]) -> str:
    return (
        f"{label}: n={len(times_us)} p50={percentile(times_us, 50):.0f}us "
        f"p99={percentile(times_us, 99):.0f}us max={max(times_us):.0f}us total={sum(times_us) / 1000:.1f}ms"
    )


def hook_payloads() -> list[dict[str, Any]]:
    per = [PAYLOADS // SESSIONS + (i < PAYLOADS % SESSIONS) for i in range(SESSIONS)]
    return [p for i, n in enumerate(per) for p in session_payloads(i, n, "/home/dev/work/carl")]


def ingest_tick(payloads: list[dict[str, Any]]) -> float:
    """Milliseconds `ingest_spool` takes to move `payloads`
    (spooled by the real recorder) into a new store."""
    from engine.store import Store
    from engine.trajectories.capture import recorder
    from engine.trajectories.capture.live import ingest_spool
    from engine.trajectories.trajectory_settings import load as load_config

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "carl"
        for payload in payloads:
            recorder.record(json.dumps(payload).encode(), home)
        with Store(home / "carl.db") as store:
            config = load_config(home)
            started = time.perf_counter()
            while ingest_spool(store, home, config).payloads:  # a burst larger than a batch takes ticks
                pass
            return (time.perf_counter() - started) * 1000


def hostile_texts() -> dict[str, str]:
    """100 KB of one marker (or marker and filler) each: text that makes a pattern start at every position."""
    size = 100_000
    pieces = {
        "word run": "a",
        "mixed base64 run": "Ab1+Zz9/",
        "mysql words": "mysql ",
        "token words": "token ",
        "key=": "key=",
        "url schemes": "://a:",
        "authorization": "authorization: ",
        "--token flags": "--token ",
        "private key headers": "-----BEGIN RSA PRIVATE KEY-----",
        "key is": "key is Ab1",
    }
    return {name: (piece * (size // len(piece) + 1))[:size] for name, piece in pieces.items()}


def detect_secrets_rows(payloads: list[str]) -> None:
    try:
        from detect_secrets.core.scan import _process_line_based_plugins
        from detect_secrets.settings import default_settings
    except ImportError:
        print("detect-secrets: not importable (not a dependency); no comparison row")
        return

    def found(text: str) -> list[str]:
        lines = list(enumerate(text.splitlines(), 1))
        return [s.secret_value or "" for s in _process_line_based_plugins(lines, "payload.txt")]

    with default_settings() as settings:
        print(
            line(
                f"detect-secrets ({len(settings.plugins)} plugins, default filters) per payload",
                timed(found, payloads),
            )
        )
        # A shape counts as caught when blanking what it reports would take the secret out of the text.
        caught = [shape for shape, text, secret in SECRETS if any(secret in v for v in found(text) if v)]
        flagged = [text for text in INTACT if found(text)]
    print(
        f"detect-secrets corpus: {len(caught)}/{len(SECRETS)} shapes caught, "
        f"{len(flagged)}/{len(INTACT)} intact texts flagged"
    )


def main() -> None:
    payloads = hook_payloads()
    texts = [json.dumps(p) for p in payloads]
    redact_value(payloads[0])  # compile the patterns outside the timing
    per_payload = timed(redact_value, payloads)
    print(line("hook payload, redact_value", per_payload))
    tick_ms = ingest_tick(payloads)
    share = sum(per_payload) / 1000 / tick_ms
    print(f"ingest_spool of the same {len(payloads)} payloads: {tick_ms:.0f}ms; redaction {share:.1%} of it")

    history = [{"role": ("user", "assistant")[i % 2], "content": texts[i * 7]} for i in range(20)]
    turn = timed(lambda h: [redact_value(m["content"]) for m in h] + [redact(texts[3])], [history] * 50)
    print(line("diagnosis turn (20 messages of history and the question)", turn))

    log = "".join(
        f"step {i} loss=0.{i % 97} rewards/format/mean=0.5 token_entropy 0.3\n" for i in range(16_000)
    )
    started = time.perf_counter()
    redact(log)
    seconds = time.perf_counter() - started
    print(
        f"training log: {len(log) / 1e6:.2f} MB in {seconds * 1000:.0f}ms "
        f"({len(log) / seconds / 1e6:.1f} MB/s)"
    )

    worst = max((timed(redact, [text])[0], name) for name, text in hostile_texts().items())
    print(f"hostile texts (100 KB each): worst {worst[0] / 1000:.1f}ms ({worst[1]})")

    corpus = [shape for shape, text, secret in SECRETS if secret not in redact(text)]
    kept = [text for text in INTACT if redact(text) == text]
    print(f"engine corpus: {len(corpus)}/{len(SECRETS)} shapes caught, {len(kept)}/{len(INTACT)} intact kept")
    detect_secrets_rows(texts)


if __name__ == "__main__":
    main()
