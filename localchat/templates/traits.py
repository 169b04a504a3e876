"""What a chat template does, learnt by rendering probe conversations (never from a list of names).

- Does it take a system message? Gemma 2 raises ``System role not supported``; Mistral 7B v0.2's
  original template demands strict user/assistant alternation. Either way the system message is
  folded into the first user message, the convention these families were trained with.
- Does it keep earlier turns as a prefix? Mistral v0.3 and Nemo move the system message into the
  last user turn, so every turn re-prefills the conversation: shown, not fought.
- Which assistant field does it render past reasoning from (``reasoning_content``, ``thinking``)?
- How does the model mark reasoning (think markers, harmony channels), what switches it
  (``enable_thinking``, gpt-oss's ``reasoning_effort``), and does the generation prompt open a think
  block whatever the switch says (DeepSeek-R1 distills)?
- Does it render tools, and how does the model mark a call (``tool_formats``)?
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localchat.templates.limits import RenderTimeout
from localchat.templates.reasoning_formats import ReasoningFormat, harmony, think_markers
from localchat.templates.tool_formats import ToolFormat, harmony_calls, json_reply, markers

Render = Callable[[list[dict[str, Any]], dict[str, Any], bool], str]  # (messages, kwargs, generation prompt)
SYSTEM, USER, ANSWER, NEXT, REASONING = "PROBE-SYSTEM", "PROBE-USER", "PROBE-ANSWER", "PROBE-NEXT", "PROBE-REASONING"
REASONING_FIELDS = ("reasoning_content", "thinking")
EFFORT = {True: "high", False: "low"}  # gpt-oss cannot answer without reasoning: low is the least
PROBE_FUNCTION = "probe_function"
PROBE_TOOL = {"type": "function", "function": {"name": PROBE_FUNCTION, "description": "A probe.", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
PROBE_CALL = {"id": "probe0001", "type": "function", "function": {"name": PROBE_FUNCTION, "arguments": {"x": 1}}}


@dataclass(frozen=True)
class TemplateTraits:
    fold_system: bool = False  # the template refuses a system message: it goes into the first user message
    system_moves: bool = False  # earlier turns are not a prefix of later prompts (KV reuse lost by design)
    reasoning_field: str | None = None  # the assistant field past reasoning is rendered from
    reasoning: ReasoningFormat | None = None
    think_switch: str | None = None  # "enable_thinking" | "reasoning_effort" | None
    always_thinks: bool = False  # the generation prompt opens a think block whatever the switch says
    takes_tools: bool = False  # the prompt changes when tools are offered
    tool_format: ToolFormat | None = None  # how its calls are read; None: not a format localchat reads

    def think_kwargs(self, think: bool | None) -> dict[str, Any]:
        """``--think/--no-think`` as the template reads it (nothing when it reads neither)."""
        if think is None or self.think_switch is None:
            return {}
        return {"reasoning_effort": EFFORT[think]} if self.think_switch == "reasoning_effort" \
            else {"enable_thinking": think}

    def notices(self, model_id: str, *, system: bool, think: bool | None) -> list[str]:
        """What the user should hear once, at the start of a session."""
        said = []
        if system and self.fold_system:
            said.append(f"{model_id}'s chat template takes no system message: it is folded into the first user "
                        "message, as the model was trained")
        if system and self.system_moves:
            said.append(f"{model_id}'s chat template moves the system message into the last user turn: each turn "
                        "re-prefills the whole conversation (KV reuse is lost by the template's design)")
        flag = {True: "--think", False: "--no-think"}.get(think) if think is not None else None
        if flag and self.reasoning is None:
            said.append(f"{model_id} has no thinking mode (no reasoning markers): {flag} changes nothing")
        elif think is False and self.always_thinks:
            said.append(f"{model_id}'s chat template always opens its think block: --no-think changes nothing")
        elif flag and think is not None and self.think_switch == "reasoning_effort":
            said.append(f"{model_id} always reasons (harmony): {flag} sets reasoning_effort to {EFFORT[think]}")
        elif flag and self.think_switch is None and not self.always_thinks:
            said.append(f"{model_id}'s chat template has no thinking switch: {flag} changes nothing")
        return said


def fold_system(system: str, content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """The system message as the head of the first user message (Gemma's own convention); in a
    message with pictures, the head of its text."""
    if isinstance(content, list):
        return [{**part, "text": f"{system}\n\n{part['text']}"} if part.get("type") == "text" else part
                for part in content]
    return f"{system}\n\n{content}"


def probe(render: Render, defaults: dict[str, Any], tokenizer: Any) -> TemplateTraits:
    """The traits of the template behind ``render``; a template that fails every probe gets the
    defaults (the first turn then reports its error)."""
    def text(messages, extra=None, generation=True) -> str | None:
        try:
            return render(messages, {**defaults, **(extra or {})}, generation)
        except RenderTimeout:
            raise  # one runaway is enough: the caller reports it
        except Exception:  # a probe the template refuses is an answer, not an error
            return None

    user, answer, nxt = ({"role": "user", "content": USER}, {"role": "assistant", "content": ANSWER},
                         {"role": "user", "content": NEXT})
    system = {"role": "system", "content": SYSTEM}
    native = text([system, user, answer, nxt])
    folded = text([{"role": "user", "content": fold_system(SYSTEM, USER)}, answer, nxt])
    fold = native is None and folded is not None
    moves = native is not None and native.find(SYSTEM) > native.find(USER)
    source = getattr(tokenizer, "chat_template", None) or ""
    named_first = sorted(REASONING_FIELDS, key=lambda f: f not in source)  # transformers may alias the others
    field = next((f for f in named_first
                  if REASONING in (text([user, {**answer, f: REASONING}], generation=False) or "")), None)
    fmt = _reasoning_format(native or folded or "", tokenizer)
    switch = _think_switch(text, user)
    closed = text([user], {"enable_thinking": False} if switch == "enable_thinking" else None) or ""
    takes_tools, tool_format = _tool_support(text, user, tokenizer)
    return TemplateTraits(fold_system=fold, system_moves=moves, reasoning_field=field, reasoning=fmt,
                          think_switch=switch, always_thinks=bool(fmt and fmt.opened_by(closed)),
                          takes_tools=takes_tools, tool_format=tool_format)


def _reasoning_format(rendered: str, tokenizer: Any) -> ReasoningFormat | None:
    if f"<|channel|>final<|message|>{ANSWER}" in rendered:
        return harmony()
    if getattr(tokenizer, "has_thinking", False):
        return think_markers(tokenizer.think_start, tokenizer.think_end)
    return None


def _think_switch(text: Callable[..., str | None], user: dict[str, Any]) -> str | None:
    """The template argument that changes the generation prompt: enable_thinking, else reasoning_effort."""
    for name, values in (("enable_thinking", (True, False)), ("reasoning_effort", ("high", "low"))):
        on, off = (text([user], {name: value}) for value in values)
        if on is not None and off is not None and on != off:
            return name
    return None


def _tool_support(
    text: Callable[..., str | None], user: dict[str, Any], tokenizer: Any
) -> tuple[bool, ToolFormat | None]:
    """Whether offering a tool changes the prompt, and the format the model's calls come in: mlx_lm's
    when it knows the family, else what the template writes for a past call."""
    offered = text([user], {"tools": [PROBE_TOOL]})
    if offered is None or offered == text([user]):
        return False, None
    if getattr(tokenizer, "has_tool_calling", False):
        return True, markers(tokenizer)
    result = {"role": "tool", "tool_call_id": PROBE_CALL["id"], "name": PROBE_FUNCTION, "content": "PROBE-RESULT"}
    called = text([user, {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]}, result],
                  {"tools": [PROBE_TOOL]}, generation=False) or ""
    if f"to=functions.{PROBE_FUNCTION}" in called:
        return True, harmony_calls()
    if f'"name": "{PROBE_FUNCTION}"' in called:
        return True, json_reply()
    return True, None
