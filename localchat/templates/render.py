"""Rendering a model's chat template: the one place localchat calls ``apply_chat_template``.

A chat template is code from the model's repository. Whatever it raises (its own
``raise_exception``, a syntax error, an undefined variable, a sandbox refusal, a value of the wrong
type) becomes one ``TemplateError`` line naming the model, so no caller ever shows a traceback; a
render has a time limit (``limits``) and a size limit. The prompt's ids are the rendered text
encoded without special tokens, as ``apply_chat_template(tokenize=True)`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from localchat.errors import LocalchatError, UsageError
from localchat.templates.limits import RenderTimeout, time_limit
from localchat.templates.traits import TemplateTraits, probe

Message = dict[str, Any]
MAX_RENDER_CHARS = 16_000_000  # ~4M tokens: more than any context window


class TemplateError(LocalchatError):
    """The model's chat template refused these messages, or failed to render."""


class RenderTooLarge(Exception):
    pass


def describe(exc: Exception) -> str:
    """The template's own message: ``raise_exception``'s text as it is, anything else with its kind."""
    from jinja2 import TemplateSyntaxError
    from jinja2.exceptions import TemplateError as JinjaError

    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    if isinstance(exc, TemplateSyntaxError):
        return f"it does not parse ({text}, line {exc.lineno})"
    if type(exc) is JinjaError and text:  # raise_exception('...')
        return f"it refused these messages: {text}"
    if isinstance(exc, (RenderTimeout, RenderTooLarge)):
        return text
    return f"it failed: {type(exc).__name__}{': ' + text if text else ''}"


@dataclass
class ChatTemplate:
    """The template of ``tokenizer`` (mlx_lm's ``TokenizerWrapper``), with the registry's arguments."""

    tokenizer: Any
    model_id: str
    defaults: dict[str, Any] = field(default_factory=dict)  # models.yaml chat_template_kwargs
    tools: list[dict[str, Any]] = field(default_factory=list)  # the functions every prompt offers

    def __post_init__(self) -> None:
        quiet_length_warning(self.tokenizer)

    @cached_property
    def _probed(self) -> TemplateTraits | TemplateError:
        try:
            return probe(self._render_text, self.defaults, self.tokenizer)
        except RenderTimeout as exc:  # no second wait: every later use reports it at once
            return TemplateError(f"{self.model_id}'s chat template: {describe(exc)}")

    @property
    def traits(self) -> TemplateTraits:
        """What probing the template found; a ``TemplateError`` when it runs away."""
        if isinstance(self._probed, TemplateError):
            raise self._probed
        return self._probed

    def kwargs(self, think: bool | None = None) -> dict[str, Any]:
        """The template arguments for a turn: the registry's, with ``--think/--no-think`` mapped to
        the switch this template reads."""
        return {**self.defaults, **self.traits.think_kwargs(think)}

    def ids(self, messages: list[Message], think: bool | None = None) -> list[int]:
        """Token ids of the prompt, the assistant turn opened: what the model is fed."""
        text = self.text(messages, think)
        return self._rendered(lambda: list(self.tokenizer.encode(text, add_special_tokens=False)))

    def text(self, messages: list[Message], think: bool | None = None) -> str:
        """The prompt as text (a render without tokenizing: for checks), the offered tools in it."""
        kwargs = {**self.kwargs(think), **({"tools": self.tools} if self.tools else {})}
        return self._rendered(lambda: self._render_text(messages, kwargs, True))

    def _render_text(self, messages: list[Message], kwargs: dict[str, Any], generation: bool) -> str:
        with time_limit():
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False,
                                                      **kwargs)
        if not isinstance(text, str):
            raise TypeError(f"it rendered {type(text).__name__}, not text")
        if len(text) > MAX_RENDER_CHARS:
            raise RenderTooLarge(f"it rendered {len(text):,} characters, over {MAX_RENDER_CHARS:,}")
        return text

    def _rendered(self, render):
        try:
            return render()
        except (KeyboardInterrupt, MemoryError, TemplateError):
            raise
        except Exception as exc:  # the template is the model's code: any failure is its failure
            raise TemplateError(f"{self.model_id}'s chat template: {describe(exc)}") from None


def quiet_length_warning(tokenizer: Any) -> None:
    """transformers warns on stderr when a text encodes past the model's length; localchat's own
    budget says what is too long (``conversation.result_cuts``), so the library's warning is marked as
    given already (its own flag) and never reaches the terminal."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    warnings = getattr(inner, "deprecation_warnings", None)
    if isinstance(warnings, dict):
        warnings["sequence-length-is-longer-than-the-specified-maximum"] = True


def template_of(tokenizer: Any, model_id: str, defaults: dict[str, Any] | None = None) -> ChatTemplate | None:
    """A ``ChatTemplate`` when ``tokenizer`` has one (a tokenizer without a template has none)."""
    if tokenizer is None or not getattr(tokenizer, "has_chat_template",
                                        isinstance(getattr(tokenizer, "chat_template", None), str)):
        return None
    return ChatTemplate(tokenizer, model_id, dict(defaults or {}))


def check_tool_support(template: ChatTemplate | None, model_id: str) -> None:
    """Tools can be offered to this model: its template renders them and its calls can be read."""
    if template is None:
        return  # a server's model without a local template: the server decides
    traits = template.traits
    if not traits.takes_tools:
        raise UsageError(f"{model_id}'s chat template has no tool support (offering tools changes nothing in its "
                         "prompt): leave out --tools, or use a model that calls tools (e.g. -m demo-tools)")
    if traits.tool_format is None:
        raise UsageError(f"{model_id}'s chat template renders tools, but its tool-call format is not one mlx_lm "
                         "0.32 or localchat reads: leave out --tools")
