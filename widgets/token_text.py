"""A completion drawn token by token, each coloured by the entropy of the distribution that produced it.

The colour is one of `LEVELS` steps of a sequential scale (committed → uncertain) whose colours the caller
takes from its theme; the edges are fixed in nats, so a colour means the same in every sample of every run.
The sample's "forking" tokens, the top `FORKING` share of its tokens by entropy (the few high-entropy tokens
where the policy chooses between continuations), are underlined. The legend gives each step in nats and, when
the vocabulary size is known, in Φ = 1 - H / ln|V|.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.style import Style
from rich.text import Text

from engine.text import visible

EDGES = (0.1, 0.5, 1.5, 3.0)  # nats: the upper edges of every step of the scale but the last
LEVELS = len(EDGES) + 1
FORKING = 0.2  # the share of a sample's tokens marked as forking


def level(entropy: float) -> int:
    """The step of the scale an entropy (nats) falls in: 0 (committed) .. LEVELS - 1 (uncertain)."""
    return next((i for i, edge in enumerate(EDGES) if entropy < edge), LEVELS - 1)


def forking_tokens(entropy: Sequence[float], share: float = FORKING) -> set[int]:
    """The positions of the top `share` of the tokens by entropy (at least one; a tie goes to the earlier)."""
    finite = [(value, i) for i, value in enumerate(entropy) if math.isfinite(value)]
    if not finite:
        return set()
    count = max(1, math.ceil(share * len(entropy)))
    ranked = sorted(finite, key=lambda pair: (-pair[0], pair[1]))
    return {i for _, i in ranked[:count]}


def phi(entropy: float, vocab_size: int | None) -> float | None:
    return None if not vocab_size or vocab_size < 2 else 1.0 - entropy / math.log(vocab_size)


def token_pieces(
    tokens: Sequence[str], entropy: Sequence[float], colours: Sequence[Style]
) -> list[tuple[str, Style | None]]:
    """The tokens as (text, style) pieces (widgets/long_text.py draws any number of them): each in the
    colour of its entropy's step, the forking ones underlined too; a token whose entropy is missing (NaN) is
    plain."""
    forks = forking_tokens(entropy)
    underline = Style(underline=True, bold=True)
    pieces: list[tuple[str, Style | None]] = []
    for i, (token, value) in enumerate(zip(tokens, entropy, strict=True)):
        shown = visible(token)  # a token may be any bytes the tokenizer knows: ESC and CR included
        if not math.isfinite(value):
            pieces.append((shown, None))
            continue
        style = colours[level(value)]
        pieces.append((shown, style + underline if i in forks else style))
    return pieces


def token_text(tokens: Sequence[str], entropy: Sequence[float], colours: Sequence[Style]) -> Text:
    """`token_pieces` as one Rich Text, for a short completion shown whole (a group's columns)."""
    text = Text()
    for shown, style in token_pieces(tokens, entropy, colours):
        text.append(shown, style=style or "")
    return text


def legend(colours: Sequence[Style], vocab_size: int | None, entropy: Sequence[float] = ()) -> Text:
    """One line per call: the scale's steps in nats (and Φ), and what the underline marks."""
    text = Text()
    text.append("token entropy: ")
    lows = (0.0, *EDGES)
    for i, low in enumerate(lows):
        high = EDGES[i] if i < len(EDGES) else None
        label = f"{low:g}–{high:g}" if high is not None else f"≥{low:g}"
        text.append("██", style=colours[i])
        text.append(f" {label} nats")
        if vocab_size and vocab_size >= 2:
            upper = phi(low, vocab_size)
            lower = phi(high, vocab_size) if high is not None else None
            span = f"Φ ≤{upper:.3f}" if lower is None else f"Φ {lower:.3f}–{upper:.3f}"
            text.append(f" ({span})", style="dim")
        text.append("  ")
    forks = forking_tokens(entropy) if entropy else set()
    text.append("\n")
    text.append("underlined", style=Style(underline=True, bold=True))
    text.append(f": forking tokens, the top {FORKING:.0%} of this sample's tokens by entropy")
    if forks:
        threshold = min(entropy[i] for i in forks)
        text.append(f" (≥ {threshold:.3g} nats here, {len(forks)} of {len(entropy)})")
    if not vocab_size:
        text.append(" · Φ needs the vocabulary size, which this run does not record", style="dim")
    return text
