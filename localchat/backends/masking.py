"""The grammar's mask for an in-process reply, built from what the turn asks (the answer's format,
the offered tools) and what the model is (its tokenizer, its reasoning markers, its call markers).

llguidance's view of the tokenizer is read once a model (about a second for SmolLM2's 49k
vocabulary), when the session is prepared; each reply compiles its grammars inside the turn's
clock, so the time it costs is counted in TTFT.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from localchat.backends.reply import opens_reasoning
from localchat.grammar.answer_formats import AnswerFormat
from localchat.grammar.compile import CallMarkers, check, grammars, llg_tokenizer, required_calls
from localchat.grammar.mask import MaskedDecoding, Reasoning
from localchat.templates.traits import TemplateTraits

JSON_CALL_PARSER = "mlx_lm.tool_parsers.json_tools"  # calls written as {"name", "arguments"} between markers


class GrammarSetup:
    """The mask's side of one loaded model."""

    def __init__(self, tokenizer: Any, vocab_size: int | None, masks_calls: bool = True):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.masks_calls = masks_calls  # off only to measure what the call grammar does (bench_constrained)

    @cached_property
    def llg(self) -> Any:
        size = max(self.vocab_size or 0, len(getattr(self.tokenizer, "_tokenizer", self.tokenizer)))
        return llg_tokenizer(self.tokenizer, size)

    def check(self, fmt: AnswerFormat) -> None:
        """A usage error before any call when the format cannot be enforced for this model."""
        check(fmt, self.llg)

    def call_markers(self, traits: TemplateTraits) -> CallMarkers | None:
        """The family's call markers when its calls are ``{"name", "arguments"}`` JSON between them."""
        fmt, parser = traits.tool_format, getattr(self.tokenizer, "tool_parser", None)
        if fmt is None or fmt.name != "markers" or not fmt.end or getattr(parser, "__module__", "") != JSON_CALL_PARSER:
            return None
        return CallMarkers(start=fmt.start, end=fmt.end)

    def reasoning(self, traits: TemplateTraits, prompt_ids: list[int]) -> Reasoning | None:
        fmt = traits.reasoning
        if fmt is None or fmt.name != "think":
            return None
        ids = [tuple(self.tokenizer.encode(m, add_special_tokens=False)) for m in (fmt.open_marker, fmt.close_marker)]
        return Reasoning(ids[0], ids[1], opened=opens_reasoning(self.tokenizer, prompt_ids, fmt))

    def for_reply(self, fmt: AnswerFormat | None, tools: list[dict[str, Any]], traits: TemplateTraits,
                  prompt_ids: list[int], offset: int, drafting: bool = False,
                  calls_required: bool = False) -> MaskedDecoding | None:
        """The processor of one reply, or None when nothing is enforced (no format; no tools whose
        calls a grammar reads). ``calls_required``: the reply is calls to ``tools`` and nothing else."""
        markers = self.call_markers(traits) if tools and self.masks_calls else None
        if fmt is None and markers is None:
            return None
        if traits.reasoning is not None and traits.reasoning.name != "think":
            return None  # harmony's channels: the answer is checked after it is written, not masked
        reasoning = self.reasoning(traits, prompt_ids)
        after = reasoning is not None
        made = required_calls(tools, markers, self.llg, after) if calls_required and markers else \
            grammars(fmt, tools, markers, self.llg, after_reasoning=after)
        return MaskedDecoding(self.llg, made, offset=offset, decode=self.tokenizer.decode, reasoning=reasoning,
                              drafting=drafting)
