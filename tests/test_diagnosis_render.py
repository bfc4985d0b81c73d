"""`carl diagnose` prints its answer for where it goes (issue 30 §11: it printed raw Markdown, `**bold**` and
`` `code` `` and all, on a terminal): drawn by Rich's Markdown on a real terminal (a pty); into a pipe and
with `--json`, the Markdown as it is. Stored text in the answer (a run's name, a metric key, a console
line) is shown as written: its escapes written out, its `**`, `[/bold]`, `<b>` and `[x](url)` as text."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from messages_server import MessagesServer
from test_cli_pty import on_a_pty
from test_diagnosis import grpo_run

from engine.coherence.analysis import analyze_run
from engine.console.scan import scan_console
from engine.diagnosis.render import AnswerPrinter, render
from engine.store import Store
from engine.text import visible

ROOT = Path(__file__).resolve().parent.parent
NAME = "x[/bold]y **b** <b>h</b>"  # a run's name: taken as written (its control characters are not)
KEY = "rewards/a\x1b[2J**k**/mean"  # a metric key from a foreign log: the store keeps its escape
LINE = "RuntimeError: \x1b[31mboom\x1b[0m **x** [y](http://evil.example) <i>z</i>"
QUESTION = "why did it crash?"


def plain(out: str) -> str:
    """The characters on screen, without their styles."""
    return re.sub(r"\x1b\[[0-9;]*m", "", out)


def hostile_run(store: Store, tmp_path: Path) -> int:
    run_id = grpo_run(store, NAME, 40, status="running", **{KEY: lambda s: 0.5})
    store.update_run(run_id, last_update=time.time())
    log = tmp_path / "train.log"
    log.write_text(f'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n{LINE}\n')
    store.system.add_console(run_id, str(log), "user")
    (console,) = store.system.consoles()
    assert scan_console(store, console, final=True).new == 1
    with store.transaction():
        analyze_run(store, run_id)
    return run_id


def env_for(home: Path, **extra: str) -> dict[str, str]:
    """The command's environment: no key of this machine, a terminal 250 columns wide (no line of stored text
    is wrapped: the assertions read each whole)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    return (
        env | {"CARL_HOME": str(home), "HOME": str(home), "TERM": "xterm-256color", "COLUMNS": "250"} | extra
    )


def shown_as_text(out: str) -> None:
    """The stored text is on screen as written, and none of its escapes reached the terminal."""
    assert "Traceback" not in out and "MarkupError" not in out, out
    assert "x[/bold]y **b** <b>h</b>" in out  # the run's name
    assert "**k**" in out and "\\x1b[2J" in out  # the metric key, its escape written out
    assert "\\x1b[31mboom\\x1b[0m **x** [y](http://evil.example) <i>z</i>" in out  # the console's line
    raw = out.replace("\\x1b", "")
    assert "\x1b[2J" not in raw and "\x1b[31m" not in raw
    assert "\x1b]8;" not in raw  # no terminal hyperlink


def test_on_a_terminal_the_answer_is_drawn_not_printed_as_markdown(store: Store, tmp_path: Path) -> None:
    run_id = hostile_run(store, tmp_path)
    argv = [sys.executable, "-m", "engine.cli", "diagnose", str(run_id), QUESTION, "--offline"]
    code, out = on_a_pty(argv, env_for(store.path.parent), timeout=120)
    assert code == 0, out
    assert out.startswith("\x1b[1mOffline analyst\x1b[0m (deterministic"), out[:200]  # bold, drawn
    assert "**Offline analyst**" not in out and "**Findings**" not in out and "\n- " not in out
    assert " • " in out  # the lists, as Rich draws them
    assert "\x1b[1;36;40m" in out or "\x1b[36" in out  # inline code, in colour
    shown_as_text(out)


def test_into_a_pipe_the_answer_is_the_markdown_as_written(store: Store, tmp_path: Path) -> None:
    """A script, a file or an issue gets the Markdown as the analyst wrote it (the same as `--json` holds),
    with the stored text's escapes written out and its marks escaped as Markdown."""
    run_id = hostile_run(store, tmp_path)
    argv = [sys.executable, "-m", "engine.cli", "diagnose", str(run_id), QUESTION, "--offline"]
    done = subprocess.run(argv, cwd=ROOT, env=env_for(store.path.parent), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert out.startswith("**Offline analyst** (deterministic, from the store; not Claude)")
    assert "\n**Findings** (" in out and "\n- " in out
    assert "\x1b" not in out  # no styles into a pipe, and the stored escapes written out
    assert "x\\[/bold\\]y \\*\\*b\\*\\* <b>h</b>" in out  # the run's name, its marks escaped
    assert "RuntimeError: \\x1b\\[31mboom" in out
    as_json = subprocess.run([*argv, "--json"], cwd=ROOT, env=env_for(store.path.parent), capture_output=True)
    result = json.loads(as_json.stdout)
    assert result["answer"].startswith("**Offline analyst**")  # the Markdown, as stored and sent
    assert out.endswith("\n") and out.rstrip("\n") == visible(result["answer"]).rstrip("\n")


def test_claudes_streamed_markdown_is_drawn_a_block_at_a_time_on_a_terminal(
    store: Store, server: MessagesServer, tmp_path: Path
) -> None:
    """Claude's answer arrives in small pieces; a block is drawn once it ends (a code fence is one block,
    blank lines and all), and links and HTML in it stay text."""
    run_id = grpo_run(store, "claude-run", 20)
    answer = (
        "The **task reward** is flat since step 12.\n\n"
        "- `rewards/task/mean`: 0.42\n- `frac_reward_zero_std`: 0.6\n\n"
        "| key | value |\n|---|---|\n| kl | 0.01 |\n\n"
        "```python\nconfig.temperature = 1.2\n\nconfig.num_generations = 16\n```\n\n"
        "See [the docs](http://evil.example) and <b>this</b>.\n"
    )
    server.text([answer[i : i + 7] for i in range(0, len(answer), 7)])
    argv = [sys.executable, "-m", "engine.cli", "diagnose", str(run_id), "why is it flat?"]
    env = env_for(store.path.parent, ANTHROPIC_API_KEY="sk-ant-test", ANTHROPIC_BASE_URL=server.base_url)
    code, out = on_a_pty(argv, env, timeout=120)
    assert code == 0, out
    assert "\x1b[1mtask reward\x1b[0m" in out and "**" not in out
    assert " • " in out and "rewards/task/mean" in out
    assert "─" in out and "| key |" not in out  # the table, drawn
    text = plain(out)
    assert "config.temperature = 1.2" in text and "config.num_generations = 16" in text  # the fence, whole
    assert "See the docs" not in out and "[the docs](http://evil.example)" in out and "<b>this</b>" in out
    assert "\x1b]8;" not in out  # no terminal hyperlink


def test_a_streamed_answer_prints_what_the_whole_answer_prints() -> None:
    """Blocks drawn as they end read the same as the answer drawn at once: a list and its loose items stay one
    list, a fence keeps its blank lines."""
    text = (
        "First **para**.\n\n1. one\n\n2. two\n   still two\n\n```\na\n\nb\n```\n\n- x\n- y\n\nLast `line`.\n"
    )
    whole = plain(render(text, terminal=True, width=80))
    for size in (1, 3, 50):
        buf = io.StringIO()
        printer = AnswerPrinter(buf, terminal=True, width=80)
        for i in range(0, len(text), size):
            printer.feed(text[i : i + size])
        printer.close()
        assert [line for line in plain(buf.getvalue()).splitlines() if line.strip()] == [
            line for line in whole.splitlines() if line.strip()
        ], size
    assert " 2 two" in whole and "still two" in whole and "**" not in whole
