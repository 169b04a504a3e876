"""History policies: how a long conversation stays inside its budget, named as bench and load
take them (``--policy full,window:4,budget:300,compact:300,pin:300``).

- ``full``: every turn (the most tokens; remembers everything until the model's window);
- ``window:N``: the last N turns (early facts go);
- ``budget:N``: whole old turns dropped in big steps once a request passes N tokens;
- ``compact:N``: the same budget, but past 80 % of it old turns become notes (one model call);
- ``pin:N``: the budget, with the script's key facts pinned after the system message.

Without ``:N`` the budget is the model's context window.

Each is a small value that ``ChatSession`` is built with: a ``TrimPolicy``, a ``CompactionPolicy``
and whether to pin; chat, bench and load use the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from localchat.conversation.compaction import CompactionPolicy
from localchat.conversation.settings import TrimPolicy
from localchat.errors import UsageError

KINDS = ("full", "window", "budget", "compact", "pin")
SYNTAX = "full, window:N, budget[:N], compact[:N] or pin[:N], separated by commas"


@dataclass(frozen=True)
class HistoryPolicy:
    kind: str
    size: int | None = None  # turns for a window, tokens for the others

    @property
    def label(self) -> str:
        return self.kind if self.size is None else f"{self.kind}:{self.size}"

    @property
    def pins_facts(self) -> bool:
        return self.kind == "pin"

    def trim(self, base: TrimPolicy) -> TrimPolicy:
        if self.kind == "window":
            return replace(base, max_turns=self.size)
        return replace(base, max_context_tokens=self.size) if self.size else base

    def compaction(self) -> CompactionPolicy | None:
        return CompactionPolicy(auto=True) if self.kind == "compact" else None


def parse_policies(text: str) -> list[HistoryPolicy]:
    """``full,window:4,budget:300`` → the policies, each once; anything else is a usage error."""
    policies = []
    for part in (p.strip() for p in text.split(",")):
        kind, _, size = part.partition(":")
        needs_size, takes_size = kind == "window", kind != "full"
        if kind not in KINDS or (needs_size and not size) or (size and not takes_size) \
                or (size and not (size.isascii() and size.isdigit() and int(size) >= 1)):
            raise UsageError(f"--policy {text!r}: {part!r} is not a policy ({SYNTAX})")
        policies.append(HistoryPolicy(kind, int(size) if size else None))
    if len({p.label for p in policies}) != len(policies):
        raise UsageError(f"--policy {text!r}: a policy is named twice")
    return policies
