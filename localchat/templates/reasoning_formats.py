"""How a model marks its reasoning in the text it generates: think markers, or harmony channels.

A format is a set of text transitions for mlx_lm's ``TextStateMachine`` (markers are matched on text
and stripped) and the names of the states whose text is reasoning or answer; text in any other
state (harmony's headers and its commentary/tool channels) is shown nowhere.

- Think markers (Qwen3, DeepSeek-R1, GLM, SmolLM3, demo-think): ``<think>…</think>answer``.
- Harmony (gpt-oss): ``<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final
  <|message|>answer``; the generation prompt ends with ``<|start|>assistant``, so a reply starts in a
  header. mlx_lm 0.32.2 splits neither in ``mlx_lm.chat`` nor in its server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REASONING, ANSWER = "reasoning", "answer"
HARMONY_CHANNEL, HARMONY_MESSAGE, HARMONY_END = "<|channel|>", "<|message|>", "<|end|>"


@dataclass(frozen=True)
class ReasoningFormat:
    name: str  # "think" | "harmony"
    transitions: dict[str, list[tuple[str, str]]]
    start: str  # the state a reply starts in, unless the prompt opened reasoning
    open_marker: str  # text that starts a reasoning block (counted as reasoning tokens)
    close_marker: str  # text that ends it
    reasoning_states: frozenset[str] = frozenset({REASONING})
    answer_states: frozenset[str] = frozenset({ANSWER})
    openers: tuple[str, ...] = field(default=())  # a stream that starts with one of these uses this format

    def kind(self, state: str | None) -> str | None:
        """"reasoning", "answer", or None for text shown nowhere (headers, other channels)."""
        if state in self.reasoning_states:
            return REASONING
        return ANSWER if state in self.answer_states else None

    def opened_by(self, prompt: str) -> bool:
        """Whether ``prompt`` (rendered text) ends inside an open reasoning block, so the reply
        starts as reasoning (templates that write ``<think>`` themselves)."""
        return self.name == "think" and prompt.rfind(self.open_marker) > prompt.rfind(self.close_marker)


def think_markers(start: str = "<think>", end: str = "</think>") -> ReasoningFormat:
    return ReasoningFormat(name="think", transitions={ANSWER: [(start, REASONING)], REASONING: [(end, ANSWER)]},
                           start=ANSWER, open_marker=start, close_marker=end, openers=(start,))


def harmony() -> ReasoningFormat:
    """gpt-oss's channels: analysis is reasoning, final is the answer, anything else is dropped."""
    heads = [(f"{HARMONY_CHANNEL}analysis", "analysis-head"), (f"{HARMONY_CHANNEL}final", "final-head"),
             ("<|start|>assistant", "header"), (HARMONY_MESSAGE, "other")]
    ends = [(HARMONY_END, "header"), ("<|return|>", "header"), ("<|call|>", "header")]
    return ReasoningFormat(
        name="harmony",
        transitions={"header": heads, "analysis-head": [(HARMONY_MESSAGE, REASONING)],
                     "final-head": [(HARMONY_MESSAGE, ANSWER)], REASONING: ends, ANSWER: ends, "other": ends},
        start="header", open_marker=f"{HARMONY_CHANNEL}analysis{HARMONY_MESSAGE}", close_marker=HARMONY_END,
        openers=(HARMONY_CHANNEL,))


def sniffed(text: str) -> ReasoningFormat | None | bool:
    """The format a stream of unknown format opens with: a format, None (plain text), or False
    while ``text`` (stripped of leading blanks) could still be the start of an opener."""
    head = text.lstrip()
    for fmt in (think_markers(), harmony()):
        for opener in fmt.openers:
            if head.startswith(opener):
                return fmt
            if opener.startswith(head):
                return False
    return None
