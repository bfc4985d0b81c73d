"""Diagnosis conversations: one per question thread, per run; listed, resumed, deleted.

The rows are the store's (engine/store/conversation_rows.py, plain sqlite3 so the control room can write its
chat rows without the heavy imports of the engine's writer). Roles: `user`, `assistant` (what is sent back to
Claude as the history), and `tool` / `error` / `note` (shown in the pane, never sent). What is stored is
redacted first (engine/redact.py): a question may quote a key or a password, and it is stored, listed and
sent back to Claude as the history of every later turn.
"""

from __future__ import annotations

from engine.store.conversation_rows import ConversationStore

HISTORY_ROLES = ("user", "assistant")


class Conversations(ConversationStore):
    """The stored conversations, and what Claude is sent of one."""

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
