"""Writes traces.jsonl with verifiers 0.4's own writer (`verifiers.v1.utils.trace_store.write_episode`), as
`vf-eval` does: the run dir set up first (an empty traces.jsonl beside `configs/`), then one episode appended
per finished rollout (verifiers/v1/cli/eval/runner.py `on_complete`: `record_run(EvalRunInfo(...))`, then
`append_episode`). Two tasks, two rollouts each, a user turn and a sampled answer with its log-probabilities.

Run with verifiers 0.4.0 installed (a venv of its own: `pip install verifiers==0.4.0`):
    python write_traces.py OUTPUT_DIR [--slow SECONDS]
It writes OUTPUT_DIR/gsm8k--tiny--default--a1b2c3d4/; tests/data/verifiers/ holds what it wrote.
`--slow` waits between episodes, for a test that follows the file while it grows.
"""

import sys
import time
from pathlib import Path

import verifiers
from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.episode import EnvInfo, Episode, EvalRunInfo
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, Reward, Trace, TraceTask
from verifiers.v1.types import AssistantMessage, UserMessage
from verifiers.v1.utils.trace_store import TRACES_FILE, write_episode

TASKS = [("What is 2+2?", "4", ["4", "5"]), ("What is 3*3?", "9", ["9", "6"])]


def episode(question: str, answer: str, reply: str) -> Episode:
    task = TraceTask(type="Task", data={"question": question, "answer": answer}, key=f"q-{answer}")
    nodes = [
        MessageNode(message=UserMessage(content=question), token_ids=[1, 2, 3], mask=[False] * 3),
        MessageNode(
            parent=0,
            message=AssistantMessage(content=reply),
            sampled=True,
            token_ids=[4, 5],
            mask=[True, True],
            logprobs=[-0.1, -0.7],
        ),
    ]
    score = 1.0 if reply == answer else 0.0
    trace = Trace(
        task=task,
        agent=AgentInfo(config=AgentConfig(model="tiny")),
        nodes=nodes,
        rewards={"correct": Reward(score=score), "format": Reward(score=1.0, weight=0.5)},
        metrics={"length": float(len(reply))},
        is_completed=True,
        ok=True,
        stop_condition="completed",
    )
    return Episode(env=EnvInfo(id="gsm8k"), task=task, traces=[trace], ok=True)


def main() -> None:
    out = Path(sys.argv[1]) / "gsm8k--tiny--default--a1b2c3d4"
    slow = float(sys.argv[sys.argv.index("--slow") + 1]) if "--slow" in sys.argv else 0.0
    (out / "configs" / "resolved").mkdir(parents=True, exist_ok=True)
    (out / "configs" / "resolved" / "eval.json").write_text('{"model": "tiny", "num_rollouts": 2}\n')
    (out / TRACES_FILE).write_text("")  # verifiers/v1/cli/output.py save_config: a fresh traces.jsonl
    for question, answer, replies in TASKS:
        for reply in replies:
            done = episode(question, answer, reply)
            done.record_run(EvalRunInfo(id="a1b2c3d4", name="gsm8k--tiny--default--a1b2c3d4"))
            write_episode(out, done)
            time.sleep(slow)
    print(f"verifiers {verifiers.__version__}: {out / TRACES_FILE}")


if __name__ == "__main__":
    main()
