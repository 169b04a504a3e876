"""Backends translate the history builder's messages into a stream of events.

A backend yields ``ReasoningChunk`` items (a thinking model's reasoning), ``TextChunk`` items (the
answer), ``ToolCall`` items (a function the model asks to call, whole), ``PrefillProgress`` while a long
prompt is prefilled, and ends with one ``Finished``; it never times, prints, runs a tool or touches
history. The in-process backend runs mlx_lm; the server backend speaks
HTTP to an OpenAI-compatible server such as ``mlx_lm.server``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Union

if TYPE_CHECKING:
    from localchat.grammar.answer_formats import AnswerFormat
    from localchat.grammar.think_budget import ThinkBudget
    from localchat.templates.render import ChatTemplate

Message = dict[str, Any]  # role and content; an assistant's tool_calls, a tool result's tool_call_id and name
DEFAULT_BASE_URL = "http://127.0.0.1:8080/v1"  # mlx_lm.server's default port, on loopback
DEFAULT_TIMEOUT_S = 120.0  # a server that makes no progress for this long ends the turn


@dataclass(frozen=True)
class GenerationParams:
    temperature: float | None = 0.0  # None (and top_p None): the server's own default (a gateway client sent none)
    top_p: float | None = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float | None = None  # None (or 1.0): off
    max_tokens: int = 256
    seed: int | None = None
    answer: AnswerFormat | None = None  # what the answer must be: masked in-process, asked for and checked over HTTP
    think: bool | None = None  # the template's enable_thinking; None: the model's own default
    think_budget: ThinkBudget | None = None  # reasoning tokens at most, then its end is forced


@dataclass(frozen=True)
class TextChunk:
    """Answer text: what is shown as the reply and committed to history."""

    text: str


@dataclass(frozen=True)
class ReasoningChunk:
    """Reasoning text of a thinking model: shown apart, kept beside the turn, never committed."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for: a function's name and its arguments as the model wrote them (JSON
    text, checked against the tool's schema before anything runs); ``id`` ties the result to it."""

    id: str
    name: str
    arguments: str
    problem: str | None = None  # why the call's text could not be read (it goes back to the model as such)


@dataclass(frozen=True)
class ToolCallText:
    """The model is writing a call: output that is not shown, but arrives on the clock as any token
    does (a call round's TTFT is its first token, not the moment the call is whole)."""


@dataclass(frozen=True)
class PrefillProgress:
    """Prompt tokens processed so far, of ``total`` (mlx_lm.server's keepalive comments)."""

    processed: int
    total: int


@dataclass(frozen=True)
class Finished:
    """Counts and the runtime's own figures, reported once the reply has ended."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    estimated: bool = False  # token counts from a local tokenizer, not from the runtime
    cache_miss_tokens: int = 0  # tokens the KV cache held but the new prompt did not share
    reasoning_tokens: int = 0  # completion tokens from the think start marker to its end marker
    reasoning_estimated: bool = False  # counted by re-tokenizing the reasoning text (HTTP)
    draft_tokens: int | None = None  # speculative decoding: completion tokens the draft model proposed and kept
    cache_rebuilt: bool = False  # the KV cache could not be trimmed to the new prompt and started again
    peak_memory_gb: float | None = None
    runtime: dict[str, float] = field(default_factory=dict)  # e.g. mlx_lm prompt_tps
    mask_s: float = 0.0  # time spent computing the grammar's masks (in-process, with a format or tools)
    masked_tokens: int = 0  # decoding steps the grammar masked
    cache_break: str | None = None  # where the prompt broke from the server's cache (its header), said short
    reasoning_cut: bool = False  # the reasoning reached the thinking budget and its end was forced


Event = Union[ReasoningChunk, TextChunk, ToolCall, ToolCallText, PrefillProgress, Finished]


class Backend(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def model_id(self) -> str: ...

    @property
    def template(self) -> ChatTemplate | None:
        """The model's chat template, when its tokenizer is on this machine."""
        ...

    def stream(self, messages: list[Message], params: GenerationParams) -> Iterator[Event]: ...

    def count_tokens(self, messages: list[Message], think: bool | None = None) -> int | None: ...

    def context_length(self) -> int | None:
        """The model's context window in tokens, when it is known."""
        ...

    def offer_tools(self, tools: list[dict[str, Any]]) -> None:
        """Offer these functions (OpenAI ``tools`` entries) in every request from now on."""
        ...

    def close(self) -> None: ...
