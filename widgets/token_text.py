"""A completion drawn token by token, each coloured by a value per token: the entropy of the distribution that
produced it, or its OPD advantage (how much more likely the teacher with the hint found it than the student).

The colour is one of the steps of a `Scale` whose colours the caller takes from its theme: `ENTROPY`, a
sequential scale (committed → uncertain), or `OPD_ADVANTAGE`, a diverging one (less likely with the hint →
about the same → more likely). The edges are fixed in nats, so a colour means the same in every sample of
every run. With entropy, the sample's "forking" tokens, the top `FORKING` share of its tokens by entropy
(the few high-entropy tokens where the policy chooses between continuations), are underlined. The entropy
legend gives each step in nats and, when the vocabulary size is known, in Φ = 1 - H / ln|V|; the diverging
legend is one line from its lowest step to its highest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text

from engine.text import visible

EDGES = (0.1, 0.5, 1.5, 3.0)  # nats: the upper edges of every step of the scale but the last
LEVELS = len(EDGES) + 1
FORKING = 0.2  # the share of a sample's tokens marked as forking


@dataclass(frozen=True)
class Scale:
    """A per-token value's colour steps: `edges` are the upper edges of every step but the last, in nats.
    A diverging scale is symmetric about zero, its middle step "about zero"; a sequential one runs from its
    first step to its last. `forking`: the top FORKING share of the tokens by value are underlined."""

    name: str
    edges: tuple[float, ...]
    diverging: bool = False
    forking: bool = False

    @property
    def levels(self) -> int:
        return len(self.edges) + 1

    def level(self, value: float) -> int:
        """The step a value falls in: 0 .. levels - 1."""
        return next((i for i, edge in enumerate(self.edges) if value < edge), self.levels - 1)


ENTROPY = Scale("token entropy", EDGES, forking=True)
# The OPD advantage is the teacher's log-prob minus the student's, clipped at ±1 nat by default
# (engine/training/opd.py, OpenClaw-RL's clip): three steps either side of a middle step for |A| < 0.05.
OPD_ADVANTAGE = Scale("OPD advantage", (-0.5, -0.2, -0.05, 0.05, 0.2, 0.5), diverging=True)


def level(entropy: float) -> int:
    """The step of the entropy scale an entropy (nats) falls in: 0 (committed) .. LEVELS - 1 (uncertain)."""
    return ENTROPY.level(entropy)


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
    tokens: Sequence[str], values: Sequence[float], colours: Sequence[Style], scale: Scale = ENTROPY
) -> list[tuple[str, Style | None]]:
    """The tokens as (text, style) pieces (widgets/long_text.py draws any number of them): each in the
    colour of its value's step on `scale` (`colours`: one style per step), with entropy the forking ones
    underlined too; a token whose value is missing (NaN) is plain."""
    forks = forking_tokens(values) if scale.forking else set()
    underline = Style(underline=True, bold=True)
    pieces: list[tuple[str, Style | None]] = []
    for i, (token, value) in enumerate(zip(tokens, values, strict=True)):
        shown = visible(token)  # a token may be any bytes the tokenizer knows: ESC and CR included
        if not math.isfinite(value):
            pieces.append((shown, None))
            continue
        style = colours[scale.level(value)]
        pieces.append((shown, style + underline if i in forks else style))
    return pieces


def token_text(
    tokens: Sequence[str], values: Sequence[float], colours: Sequence[Style], scale: Scale = ENTROPY
) -> Text:
    """`token_pieces` as one Rich Text, for a short completion shown whole (a group's columns, a task)."""
    text = Text()
    for shown, style in token_pieces(tokens, values, colours, scale):
        text.append(shown, style=style or "")
    return text


def diverging_legend(colours: Sequence[Style], scale: Scale, meaning: str) -> Text:
    """One line: `<-0.5 ██████████████ ≥+0.5 nats · <meaning>`, a block per step from the lowest to the
    highest (the middle one plain: about zero)."""
    low, high = scale.edges[0], scale.edges[-1]
    text = Text(f"<{low:+g} ")
    for style in colours:
        text.append("██", style=style)
    text.append(f" ≥{high:+g} nats")
    if meaning:
        text.append(f" · {meaning}", style="dim")
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
