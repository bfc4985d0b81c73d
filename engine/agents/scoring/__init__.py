"""Step scoring of the agents plane: PRM judges, environment profiles, and the reward.

After Tentalis (docs/reference/agents-plane.md §5-6), with the project's rules (§12):
- every step score is clamped to [0, 1] at the scorer (published, a judge replying 3 and 3 put 3.0
  into the rollout);
- the profile comes from the result's own `environment` field (published, it was read from a field
  that does not exist, so every result was scored as `chat`);
- every dimension of every profile is implemented (published, only prm and halugate were); a
  dimension without its evidence is left out and the weights renormalise over the others, and the
  rollout lists the dimensions that scored it;
- the reward the trainer optimises is the outcome, averaged with the task's verifier where it has
  one, never the manager's feedback (docs/reference/agents-plane.md §12 rule 4).

One module per concern, each reading only those before it:
- `scale`: the [0, 1] scale (`clamp01`, `mean`, `NEUTRAL`);
- `replies`: a reply's `<step>..</step>` spans and `<answer>..</answer>` (`split_reply`, `render_reply`);
- `text`: reading text without a model (terms, numbers, names, JSON, arithmetic, claims, `Source`);
- `judges`: one step judged `{progress, correctness, reasoning}` seeing steps 1..i only, by the offline
  heuristic (`OfflineJudge`), an OpenAI-compatible server (`OpenAIJudge`) or Claude (`ClaudeJudge`);
- `prm`: the process reward, the median of the judges' votes per step (`PRMScorer`);
- `halugate`, `actions`: the hallucination check (a right answer above a wrong one above one that does
  not answer) and the GUI-action grammar, two of the dimensions;
- `dimensions`: every dimension and the environment profiles that weigh them;
- `combiner`: the profile's weighted score and the reward (`CombinedScorer`, `reward_of`); a profile
  left with cost dimensions only (terminal without exit codes) gives way to the chat profile.
"""

from .actions import GuiAction, parse_action
from .combiner import Combined, CombinedScorer, ScoredResult, combine, profile_for, reward_of
from .dimensions import COST, PROFILES, Evidence, LengthBand, changed_lines
from .halugate import CONTRADICTED, IRRELEVANT, SUPPORTED, UNSUPPORTED, claim_verdict, halugate_score
from .judges import (
    ClaudeJudge,
    JudgeReplyError,
    OfflineJudge,
    OpenAIJudge,
    StepJudge,
    first_text,
    judge_prompt,
    parse_json_object,
)
from .prm import PRMScorer, StepScores, vote_of
from .replies import render_reply, split_reply
from .scale import NEUTRAL, clamp01, mean
from .text_reading import (
    Source,
    arithmetic,
    balanced,
    checked_numbers,
    claims,
    covers,
    distinct_ratio,
    equations,
    facts,
    identifiers,
    json_values,
    readability,
    salient_terms,
)

__all__ = [
    "CONTRADICTED",
    "COST",
    "IRRELEVANT",
    "NEUTRAL",
    "PROFILES",
    "SUPPORTED",
    "UNSUPPORTED",
    "ClaudeJudge",
    "Combined",
    "CombinedScorer",
    "Evidence",
    "GuiAction",
    "JudgeReplyError",
    "LengthBand",
    "OfflineJudge",
    "OpenAIJudge",
    "PRMScorer",
    "ScoredResult",
    "Source",
    "StepJudge",
    "StepScores",
    "arithmetic",
    "balanced",
    "changed_lines",
    "checked_numbers",
    "claim_verdict",
    "claims",
    "clamp01",
    "combine",
    "covers",
    "distinct_ratio",
    "equations",
    "facts",
    "first_text",
    "halugate_score",
    "identifiers",
    "json_values",
    "judge_prompt",
    "mean",
    "parse_action",
    "parse_json_object",
    "profile_for",
    "readability",
    "render_reply",
    "reward_of",
    "salient_terms",
    "split_reply",
    "vote_of",
]
