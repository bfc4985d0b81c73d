"""Diagnosis conversations in carl.db: one per question thread, per run, with their messages; listed, added
to, deleted.

Plain sqlite3 (no sqlite-utils) so the control room can write its chat rows without the heavy imports of the
engine's writer. Every message is redacted as it is stored (`insert_chat_message`). What is sent back to
Claude of a conversation is diagnosis's choice (engine/diagnosis/conversations.py).
"""

from __future__ import annotations

import builtins
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .base import StoreError, check_schema, connect, insert_chat_message


class ConversationStore:
    """The conversations and chat messages of carl.db, on a connection of its own (one thread at a time)."""

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

    def messages(self, conversation_id: int) -> builtins.list[dict[str, Any]]:  # `list` is a method here
        """The conversation's messages, oldest first, their meta decoded."""
        rows = self.conn.execute(
            "SELECT id, role, content, meta, created_at FROM chat_messages WHERE conversation_id=? "
            "ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [
            {"id": r[0], "role": r[1], "content": r[2], "meta": json.loads(r[3] or "{}"), "created_at": r[4]}
            for r in rows
        ]

    def delete(self, conversation_id: int) -> bool:
        """Delete the conversation and its messages; whether there was one."""
        with self._transaction():
            self.conn.execute("DELETE FROM chat_messages WHERE conversation_id=?", (conversation_id,))
            return self.conn.execute("DELETE FROM conversations WHERE id=?", (conversation_id,)).rowcount > 0

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction, taken at once (BEGIN IMMEDIATE); rolled back when what runs in it raises."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
