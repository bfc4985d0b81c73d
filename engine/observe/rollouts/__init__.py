"""Rollouts from other tools' dumps, into the store's one `rollouts` table (engine/store/rollouts.py).

Four source kinds, each followed as it is written and restart-safe (the cursor is committed with the rows):

    rollouts-trl        TRL's completions/completions_NNNNN.parquet (pyarrow: parquet extra)   trl.py
    rollouts-verl       veRL's rollout_data_dir/{step}.jsonl                                  verl.py
    rollouts-prime      prime-rl's rollouts/step_N/train/effective/traces.jsonl                prime.py
    rollouts-verifiers  verifiers' results.jsonl (vf-eval)                                     verifiers.py

A source's samples join the run of the source its `attach_to` names, else a run of its own (rollout_base.py).
Our own GRPO runs write their rollouts through the training Reporter instead (engine/training/backend.py).
Rollouts a tracker logged come with that tracker's source, not as a source kind of their own: Trackio's traces
(engine/observe/trackio_traces.py) and TensorBoard's texts of samples (tensorboard_text.py), their fields
named by one declarative column map per source (columns.py, as are W&B Tables' columns).
"""

from __future__ import annotations

from . import prime, trl, verifiers, verl

READERS = {
    "rollouts-trl": trl.ingest,
    "rollouts-verl": verl.ingest,
    "rollouts-prime": prime.ingest,
    "rollouts-verifiers": verifiers.ingest,
}

__all__ = ["READERS"]
