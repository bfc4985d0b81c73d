"""Claude (the Anthropic Messages API) for every engine part that asks it: which model, and a client.

Diagnosis streams with a synchronous client; the agents' judge and manager feedback call an
asynchronous one. The SDK is imported only when a client is made, so the control room never loads
it; without it, diagnosis answers offline and the agents say how to install it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from engine.errors import CarlError

DEFAULT_MODEL = "claude-sonnet-5-5"
MODEL_ENV = "CARL_CLAUDE_MODEL"
INSTALL = "pip install 'carl-tui[claude]'"


class ClaudeUnavailable(CarlError):
    """The anthropic package is not installed, as one line that says how to install it."""


def resolve_model(explicit: str | None = None, configured: str | None = None) -> str:
    """`/model` or --model, then $CARL_CLAUDE_MODEL, then the config file, then the default."""
    return explicit or os.environ.get(MODEL_ENV) or configured or DEFAULT_MODEL


def sdk_installed() -> bool:
    return importlib.util.find_spec("anthropic") is not None


def client(api_key: str | None, base_url: str | None, timeout: float, max_retries: int) -> Any:
    """A synchronous `anthropic.Anthropic`."""
    return _sdk().Anthropic(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries)


def async_client(api_key: str, base_url: str | None, timeout: float, max_retries: int) -> Any:
    """An `anthropic.AsyncAnthropic`."""
    return _sdk().AsyncAnthropic(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=max_retries)


class AsyncAsker:
    """One user message to Claude, one reply: the model (`resolve_model`), the reply's token budget and an
    `AsyncAnthropic` client, as the agents plane's judge, feedback and hints use them."""

    def __init__(
        self,
        api_key: str,
        model: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
        max_tokens: int = 256,
    ) -> None:
        self.model = resolve_model(model)  # one model for every Claude request the engine makes
        self.max_tokens = max_tokens
        self._client = async_client(api_key, base_url, timeout, max_retries)

    async def ask(self, prompt: str) -> Any:
        """The Messages API's reply (a `Message`) to `prompt`; the SDK's errors as they come."""
        return await self._client.messages.create(
            model=self.model, max_tokens=self.max_tokens, messages=[{"role": "user", "content": prompt}]
        )

    async def aclose(self) -> None:
        await self._client.close()


def _sdk() -> Any:
    try:
        import anthropic  # only here: the control room never loads the SDK
    except ImportError:
        raise ClaudeUnavailable(f"Claude needs the anthropic package: {INSTALL}") from None
    return anthropic
