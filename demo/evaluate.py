"""Score a chat model on held-out demo conversations (the demo model's quality bar).

Each conversation is replayed turn by turn with the model's *own* earlier replies in the
history, exactly as a chat session would send them, at temperature 0.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from demo.corpus import EVAL_BEHAVIOURS, JSON_SYSTEM, Dialogue, heldout_dialogue
from localchat.conversation.history import Conversation, Turn

MAX_REPLY_TOKENS = 32


THINK_END = "</think>"


@dataclass
class Reply:
    text: str  # everything the model generated, reasoning included
    finish_reason: str | None
    tokens: int

    @property
    def answer(self) -> str:
        """What a chat keeps: the text after the reasoning, when the model reasoned."""
        return self.text.rpartition(THINK_END)[2] if THINK_END in self.text else self.text

    @property
    def reasoned(self) -> bool:
        return self.text.startswith("<think>") and THINK_END in self.text

    @property
    def clean(self) -> bool:
        """Valid UTF-8 (no replacement character) and ended by the end-of-turn token in time."""
        return "\ufffd" not in self.text and self.finish_reason == "stop"


@dataclass
class BehaviourScore:
    behaviour: str
    passed: int = 0
    total: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


def generate_reply(model: Any, tokenizer: Any, messages: list[dict[str, str]],
                   template_kwargs: dict[str, Any] | None = None, max_tokens: int = MAX_REPLY_TOKENS) -> Reply:
    from mlx_lm import stream_generate

    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **(template_kwargs or {}))
    text, last = "", None
    for last in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        text += last.text
    return Reply(text, last.finish_reason, last.generation_tokens)


def replay(model: Any, tokenizer: Any, dialogue: Dialogue, template_kwargs: dict[str, Any] | None = None,
           max_tokens: int = MAX_REPLY_TOKENS) -> list[Reply]:
    """Play every user turn; the history holds the model's own answers, not the gold ones."""
    conversation = Conversation(dialogue.system)
    replies = []
    for exchange in dialogue.exchanges:
        reply = generate_reply(model, tokenizer, conversation.preview(exchange.user), template_kwargs, max_tokens)
        replies.append(reply)
        conversation.commit(Turn(exchange.user, reply.answer))
    return replies


def _is_answer_json(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and set(value) == {"answer"} and isinstance(value["answer"], str)


def first_failure(dialogue: Dialogue, replies: list[Reply]) -> str | None:
    """``'expected' <- 'got'`` for the first reply that fails the conversation, or None. It names
    the scored reply that was wrong, not the last one (a correction exercise may end with an
    unscored question)."""
    if dialogue.system == JSON_SYSTEM:
        for reply in replies:
            if not _is_answer_json(reply.answer):
                return f"JSON {{\"answer\": string}} <- {reply.text!r}"
    for i in dialogue.scored:
        if replies[i].answer != dialogue.exchanges[i].assistant:
            return f"{dialogue.exchanges[i].assistant!r} <- {replies[i].text!r}"
    return None


def evaluate(model: Any, tokenizer: Any, n: int, seed: int, behaviours: tuple[str, ...] = EVAL_BEHAVIOURS,
             template_kwargs: dict[str, Any] | None = None, max_tokens: int = MAX_REPLY_TOKENS) -> dict[str, Any]:
    """Figures of the quality bar: per-behaviour pass rates, JSON validity, clean endings, and
    how many replies reasoned first (a thinking model's ``<think>…</think>``)."""
    rng = random.Random(seed)
    scores = {b: BehaviourScore(b) for b in behaviours}
    json_valid = json_total = clean = answers = reasoned = 0
    for behaviour in behaviours:
        for _ in range(n):
            dialogue = heldout_dialogue(rng, behaviour)
            replies = replay(model, tokenizer, dialogue, template_kwargs, max_tokens)
            score = scores[behaviour]
            score.total += 1
            failure = first_failure(dialogue, replies)
            if failure is None:
                score.passed += 1
            elif len(score.failures) < 5:
                score.failures.append(failure)
            if behaviour == "json":
                json_total += len(replies)
                json_valid += sum(_is_answer_json(r.answer) for r in replies)
            answers += len(replies)
            clean += sum(r.clean for r in replies)
            reasoned += sum(r.reasoned for r in replies)
    return {
        "conversations_per_behaviour": n,
        "behaviours": {b: {"passed": s.passed, "total": s.total, "rate": round(s.rate, 4),
                           "failures": s.failures} for b, s in scores.items()},
        "json_valid": {"valid": json_valid, "total": json_total},
        "clean_endings": {"clean": clean, "total": answers},
        "reasoned": {"reasoned": reasoned, "total": answers},
    }
