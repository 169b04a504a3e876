"""Rendering a model's chat template: the one place localchat calls ``apply_chat_template``.

A chat template is code from the model's repository. Whatever it raises (its own
``raise_exception``, a syntax error, an undefined variable, a sandbox refusal, a value of the wrong
type) becomes one ``TemplateError`` line naming the model, so no caller ever shows a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from localchat.errors import LocalchatError
from localchat.templates.traits import TemplateTraits, probe

Message = dict[str, Any]


class TemplateError(LocalchatError):
    """The model's chat template refused these messages, or failed to render."""


def describe(exc: Exception) -> str:
    """The template's own message: ``raise_exception``'s text as it is, anything else with its kind."""
    from jinja2 import TemplateSyntaxError
    from jinja2.exceptions import TemplateError as JinjaError

    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    if isinstance(exc, TemplateSyntaxError):
        return f"it does not parse ({text}, line {exc.lineno})"
    if type(exc) is JinjaError and text:  # raise_exception('...')
        return f"it refused these messages: {text}"
    return f"it failed: {type(exc).__name__}{': ' + text if text else ''}"


@dataclass
class ChatTemplate:
    """The template of ``tokenizer`` (mlx_lm's ``TokenizerWrapper``), with the registry's arguments."""

    tokenizer: Any
    model_id: str
    defaults: dict[str, Any] = field(default_factory=dict)  # models.yaml chat_template_kwargs

    @cached_property
    def traits(self) -> TemplateTraits:
        return probe(self._render_text, self.defaults, self.tokenizer)

    def kwargs(self, think: bool | None = None) -> dict[str, Any]:
        """The template arguments for a turn: the registry's, with ``--think/--no-think`` mapped to
        the switch this template reads."""
        return {**self.defaults, **self.traits.think_kwargs(think)}

    def ids(self, messages: list[Message], think: bool | None = None) -> list[int]:
        """Token ids of the prompt, the assistant turn opened: what the model is fed."""
        return self._rendered(lambda: list(self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, **self.kwargs(think))))

    def text(self, messages: list[Message], think: bool | None = None) -> str:
        """The prompt as text (a render without tokenizing: for checks)."""
        return self._rendered(lambda: self._render_text(messages, self.kwargs(think), True))

    def _render_text(self, messages: list[Message], kwargs: dict[str, Any], generation: bool) -> str:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False,
                                                  **kwargs)
        if not isinstance(text, str):
            raise TypeError(f"it rendered {type(text).__name__}, not text")
        return text

    def _rendered(self, render):
        try:
            return render()
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as exc:  # the template is the model's code: any failure is its failure
            raise TemplateError(f"{self.model_id}'s chat template: {describe(exc)}") from None


def template_of(tokenizer: Any, model_id: str, defaults: dict[str, Any] | None = None) -> ChatTemplate | None:
    """A ``ChatTemplate`` when ``tokenizer`` has one (a tokenizer without a template has none)."""
    if tokenizer is None or not isinstance(getattr(tokenizer, "chat_template", None), str):
        return None
    return ChatTemplate(tokenizer, model_id, dict(defaults or {}))
