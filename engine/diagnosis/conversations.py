"""Diagnosis conversations in carl.db: one per question thread, per run; listed, resumed, deleted.

Plain sqlite3 (no sqlite-utils) so the control room can write its chat rows without the heavy
imports of the engine's writer. Roles: `user`, `assistant` (what is sent back to Claude as the
history), and `tool` / `error` / `note` (shown in the pane, never sent). What is stored is redacted first
(engine/redact.py): a question may quote a key or a password, and it is stored, listed and sent back
to Claude as the history of every later turn.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from engine.store.base import StoreError, check_schema, connect, insert_chat_message

HISTORY_ROLES = ("user", "assistant")


class Conversations:
    def __init__(self, db_path: Path) -> None:
        if not Path(db_path).exists():
            raise StoreError(f"{db_path}: no carl database here")
        self.conn = connect(Path(db_path), readonly=False)
        self.conn.execute("PRAGMA busy_timeout=30000")
        check_schema(self.conn, Path(db_path))

    def close(self) -> None:
        self.conn.close()

    def add(
        self,
        conversation_id: int | None,
        run_id: int | None,
        role: str,
        content: str,
        meta: dict[str, Any] | None = None,
    ) -> tuple[int, int]:
        """Append a message, redacted (its text and its meta: a tool's input, by `insert_chat_message`),
        starting a conversation (titled by its first line) when none is given."""
        with self._transaction():
            return insert_chat_message(self.conn, conversation_id, run_id, role, content, meta)

    def list(self, run_id: int | None) -> list[dict[str, Any]]:
        """The run's conversations, newest first, with their message counts."""
        rows = self.conn.execute(
            "SELECT c.id, c.title, c.created_at, c.updated_at, count(m.id) FROM conversations c"
            " LEFT JOIN chat_messages m ON m.conversation_id = c.id WHERE c.run_id IS ?"
            " GROUP BY c.id ORDER BY c.updated_at DESC, c.id DESC",
            (run_id,),
        ).fetchall()
        return [
            {"id": r[0], "title": r[1], "created_at": r[2], "updated_at": r[3], "messages": r[4]}
            for r in rows
        ]

    def messages(self, conversation_id: int) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT id, role, content, meta, created_at FROM chat_messages WHERE conversation_id=? "
            "ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [
            {"id": r[0], "role": r[1], "content": r[2], "meta": json.loads(r[3] or "{}"), "created_at": r[4]}
            for r in rows
        ]

    def history(self, conversation_id: int | None) -> list[dict[str, str]]:
        """What Claude is sent of earlier turns: user and assistant text, alternating."""
        if conversation_id is None:
            return []
        out: list[dict[str, str]] = []
        for m in self.messages(conversation_id):
            if m["role"] not in HISTORY_ROLES or not m["content"].strip():
                continue
            if out and out[-1]["role"] == m["role"]:  # an unanswered question: fold it into the next
                out[-1]["content"] += "\n\n" + m["content"]
            else:
                out.append({"role": m["role"], "content": m["content"]})
        if out and out[-1]["role"] == "user":
            out.pop()  # a question that got no answer (an error) is asked again, not repeated
        return out

    def delete(self, conversation_id: int) -> bool:
        with self._transaction():
            self.conn.execute("DELETE FROM chat_messages WHERE conversation_id=?", (conversation_id,))
            return self.conn.execute("DELETE FROM conversations WHERE id=?", (conversation_id,)).rowcount > 0

    def _transaction(self) -> _Tx:
        return _Tx(self.conn)


class _Tx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")
