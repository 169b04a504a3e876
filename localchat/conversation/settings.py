"""The settings that keep a conversation inside its limits, and their defaults: how long an input
may be, how the history is trimmed, when it is compacted. A small module of values only, so the
command line can declare its options without loading the conversation machinery."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_INPUT_CHARS = 8000
DEFAULT_TRIM_TO = 0.5  # big steps: down to half the budget, so the next turns share the prefix again
DEFAULT_TRIGGER = 0.8  # the share of the budget a prompt may fill before it is compacted
DEFAULT_KEEP = 2  # turns kept verbatim after a summary


@dataclass
class TrimPolicy:
    max_turns: int | None = None  # the window: at most this many past turns
    max_context_tokens: int | None = None  # the budget
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS
    trim_to: float = DEFAULT_TRIM_TO  # past the budget, drop turns down to this share of it
