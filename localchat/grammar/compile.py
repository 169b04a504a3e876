"""An answer's format, and a family's tool calls, as llguidance grammars for one tokenizer.

llguidance (chosen by measurement: ``scripts/compare_grammar_libraries.py``) reads the model's fast
tokenizer itself, compiles a JSON Schema, a regular expression or a Lark grammar in milliseconds,
and bounds the work a hostile grammar can cost (its parser limits). A grammar that cannot be
compiled, or that admits no text at all, is refused here in one line naming it, before any model
call. A call's grammar (``{"name": TOOL, "arguments": ARGS}`` between the family's markers, one
alternative a tool, each with its own schema) is made for the families whose calls are that JSON
(Qwen's ``<tool_call>``, which demo-tools writes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localchat.errors import UsageError
from localchat.grammar.answer_formats import AnswerFormat

LEADING_SPACE = r"/[ \t\n]{0,4}/"  # a thinking model writes a line break or two after its reasoning
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(UsageError):
    """The format cannot be made into a grammar for this model (exit 2, before any call)."""


@dataclass(frozen=True)
class CallMarkers:
    """How a family marks a call whose text is ``{"name", "arguments"}`` JSON."""

    start: str
    end: str


def llg_tokenizer(tokenizer: Any, vocab_size: int | None = None) -> Any:
    """llguidance's view of mlx_lm's ``TokenizerWrapper`` (about a second for a 49k vocabulary:
    read once a model), with every token that ends a reply as its end."""
    import llguidance.hf

    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    ends = sorted(getattr(tokenizer, "eos_token_ids", None) or [inner.eos_token_id])
    return llguidance.hf.from_tokenizer(inner, n_vocab=vocab_size, eos_token=ends)


class _Bytes:
    """A tokenizer of one token a byte (and an end), for ``byte_tokenizer``."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<end>"]
    special_token_ids = [256]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode("utf-8"))


def byte_tokenizer() -> Any:
    """llguidance's view of a tokenizer that can write any text a byte at a time (2 ms to build):
    what ``check`` uses before a model's own tokenizer is loaded, so that a format that admits no
    text at all is refused before the model loads too."""
    from llguidance import LLTokenizer, TokenizerWrapper

    return LLTokenizer(TokenizerWrapper(_Bytes()))


def _literal(text: str, llg: Any | None) -> str:
    """A marker in Lark: its special token when it is one, else its text."""
    if llg is not None:
        ids = llg.tokenize_str(text)
        if len(ids) == 1 and llg.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
    return json.dumps(text)


def body_rule(fmt: AnswerFormat) -> str:
    """The Lark right-hand side of the answer itself."""
    if fmt.schema is not None:
        return "%json " + json.dumps({**fmt.schema, "x-guidance": JSON_STYLE})
    if fmt.pattern is not None:
        return _lark_regex(fmt.pattern)
    return " | ".join(json.dumps(choice) for choice in fmt.choices)


def _lark_regex(pattern: str) -> str:
    """The pattern as a Lark ``/…/`` literal: each ``/`` escaped once, one the user escaped
    (``a\\/b``) left as it is."""
    out, escaped = [], False
    for char in pattern:
        out.append("\\/" if char == "/" and not escaped else char)
        escaped = char == "\\" and not escaped
    return "/" + "".join(out) + "/"


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON of one call: one alternative a tool, its name fixed, its arguments its schema. A
    schema's own definitions (``$defs``, as pydantic writes nested models) move to the root under
    the tool's number, and its ``$ref``s with them: they would point nowhere inside ``anyOf``."""
    defs: dict[str, Any] = {}
    alternatives = []
    for number, tool in enumerate(tools):
        arguments = _hoisted(tool["function"]["parameters"], f"t{number}", defs)
        alternatives.append({"type": "object", "properties": {"name": {"const": tool["function"]["name"]},
                                                              "arguments": arguments},
                             "required": ["name", "arguments"], "additionalProperties": False})
    return {"anyOf": alternatives, **({"$defs": defs} if defs else {})}


def _hoisted(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its definitions put in ``defs`` as ``PREFIX_NAME`` and its references
    rewritten to them (``#`` itself, a recursive schema, becomes ``#/$defs/PREFIX``)."""
    own = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    if not own and not _refers(schema):
        return schema

    def moved(value: Any) -> Any:
        if isinstance(value, dict):
            out = {k: moved(v) for k, v in value.items() if k not in ("$defs", "definitions")}
            ref = value.get("$ref")
            if isinstance(ref, str) and (ref == "#" or ref.startswith(("#/$defs/", "#/definitions/"))):
                out["$ref"] = f"#/$defs/{prefix}" if ref == "#" else f"#/$defs/{prefix}_{ref.split('/', 2)[2]}"
            return out
        return [moved(v) for v in value] if isinstance(value, list) else value

    for name, definition in own.items():
        defs[f"{prefix}_{name}"] = moved(definition)
    defs[prefix] = moved(schema)
    return {"$ref": f"#/$defs/{prefix}"}


def _refers(value: Any) -> bool:
    if isinstance(value, dict):
        return "$ref" in value or any(_refers(v) for v in value.values())
    return any(_refers(v) for v in value) if isinstance(value, list) else False


def refused_tools(tools: list[dict[str, Any]], llg: Any | None) -> dict[str, str]:
    """The tools whose arguments' schema the grammar cannot take (an unsupported keyword, a
    reference to nothing, no value at all), each with why: they are left out, never the others."""
    from llguidance import LLMatcher

    refused = {}
    for tool in tools:
        if not admits_a_value(tool["function"].get("parameters", {})):
            refused[tool["function"]["name"]] = NO_VALUE
            continue
        schema = json.dumps({**call_schema([tool]), "x-guidance": JSON_STYLE})
        error = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(f"start: %json {schema}"), llg)
        if error:
            refused[tool["function"]["name"]] = _first_line(error)
    return refused


NO_VALUE = "no value satisfies it (a $ref cycle, or a property required all the way down)"
ADMITS_BUDGET = 20_000  # schema nodes visited before the answer is taken to be yes


def admits_a_value(schema: Any) -> bool:
    """Whether some finite JSON value satisfies ``schema``, for the parts that decide it (``$ref``
    to ``#`` or its definitions, ``anyOf``/``oneOf``/``allOf``, required properties, ``minItems``).
    A schema that admits none (``{"$ref": "#"}``, or an object whose required property is itself)
    would let a grammar open an answer it can never close: llguidance compiles lazily and cannot
    tell. A node met again on the way down counts as no; a schema too large to walk counts as yes."""
    steps = [0]

    def target(ref: str) -> Any:
        if ref == "#":
            return schema
        kind, _, name = ref.removeprefix("#/").partition("/")
        found = schema.get(kind, {}) if kind in ("$defs", "definitions") else None
        return found.get(name, True) if isinstance(found, dict) else True

    def admits(node: Any, seen: tuple[int, ...]) -> bool:
        steps[0] += 1
        if steps[0] > ADMITS_BUDGET:
            return True
        if not isinstance(node, dict):
            return node is not False
        if id(node) in seen:
            return False
        seen = (*seen, id(node))
        ref = node.get("$ref")
        if isinstance(ref, str) and not admits(target(ref), seen):
            return False
        for key, needs_all in (("allOf", True), ("anyOf", False), ("oneOf", False)):
            parts = node.get(key)
            if isinstance(parts, list) and parts:
                results = (admits(part, seen) for part in parts)
                if not (all(results) if needs_all else any(results)):
                    return False
        found_properties, found_required = node.get("properties"), node.get("required")
        properties: dict[str, Any] = found_properties if isinstance(found_properties, dict) else {}
        required: list[Any] = found_required if isinstance(found_required, list) else []
        if not all(admits(properties[name], seen) for name in required if isinstance(name, str) and name in properties):
            return False
        min_items = node.get("minItems")
        return not (isinstance(node.get("items"), dict) and isinstance(min_items, int) and min_items > 0
                    and not admits(node["items"], seen))

    return admits(schema, ())


def call_rule(tools: list[dict[str, Any]], markers: CallMarkers, llg: Any | None) -> str:
    """One call, after its start marker: the JSON, then the end marker."""
    return f'/\\n?/ %json {json.dumps({**call_schema(tools), "x-guidance": JSON_STYLE})} /\\n?/ ' \
           f'{_literal(markers.end, llg)}'


@dataclass(frozen=True)
class Grammars:
    """What the mask works with for one turn: the answer's grammar (or None: free text), the calls'
    (or None: calls unconstrained), and the markers that open a call."""

    answer: str | None
    call: str | None
    markers: CallMarkers | None


def grammars(fmt: AnswerFormat | None, tools: list[dict[str, Any]], markers: CallMarkers | None,
             llg: Any | None, after_reasoning: bool = False) -> Grammars:
    """The turn's grammars. With both a format and tools, the answer is either the format or calls;
    after reasoning, a few line breaks may come first (what a thinking model writes after it)."""
    from llguidance import LLMatcher

    call = call_rule(tools, markers, llg) if tools and markers else None
    space = f"{LEADING_SPACE} " if after_reasoning else ""
    answer = None
    if fmt is not None:
        lark = f"start: {space}body\nbody: {body_rule(fmt)}"
        if call and markers is not None:
            lark = (f"start: {space}(body | calls)\nbody: {body_rule(fmt)}\ncalls: call+\n"
                    f"call: {_literal(markers.start, llg)} {call}")
        answer = LLMatcher.grammar_from_lark(lark)
    return Grammars(answer=answer, call=LLMatcher.grammar_from_lark(f"start: {call}") if call else None,
                    markers=markers if call else None)


def required_calls(tools: list[dict[str, Any]], markers: CallMarkers, llg: Any | None,
                   after_reasoning: bool = False) -> Grammars:
    """The grammars of a reply that must be calls to ``tools`` (OpenAI's ``tool_choice``
    ``required``, or one function named): no text, one call or more."""
    from llguidance import LLMatcher

    call = call_rule(tools, markers, llg)
    space = f"{LEADING_SPACE} " if after_reasoning else ""
    answer = f"start: {space}calls\ncalls: call+\ncall: {_literal(markers.start, llg)} {call}"
    return Grammars(answer=LLMatcher.grammar_from_lark(answer), call=LLMatcher.grammar_from_lark(f"start: {call}"),
                    markers=markers)


def check(fmt: AnswerFormat, llg: Any | None) -> None:
    """A ``GrammarError`` naming the format when it cannot be compiled, or (with the model's
    tokenizer) when it admits no text at all; nothing when it can be enforced."""
    from llguidance import LLMatcher

    if fmt.schema is not None and not admits_a_value(fmt.schema):
        raise GrammarError(f"{fmt.described()} cannot be enforced: {NO_VALUE}")
    if fmt.schema is not None and (where := beyond_64_bits(fmt.schema)):
        raise GrammarError(f"{fmt.described()} cannot be enforced: {where} is past what the grammar can hold "
                           "(integers within ±2^63)")
    body = LLMatcher.grammar_from_lark(f"start: {body_rule(fmt)}")
    error = LLMatcher.validate_grammar(body, llg)
    if error:
        raise GrammarError(f"{fmt.described()} cannot be enforced: {_first_line(error)}")
    if llg is None:
        return
    matcher = LLMatcher(llg, body)
    mask = matcher.compute_bitmask()  # an empty language shows only here: the matcher finds no way on
    if matcher.is_error() and "NoExtension" not in matcher.get_error():
        raise GrammarError(f"{fmt.described()} cannot be enforced: {_first_line(matcher.get_error())}")
    if matcher.is_error() or (not matcher.is_accepting() and not any(mask)):
        raise GrammarError(f"{fmt.described()} matches no text at all: no answer could ever be written")


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "const")
LIMIT = 2**63 - 1


def beyond_64_bits(schema: Any, path: str = "the schema") -> str | None:
    """Where a schema holds a number bound past ±2^63 (llguidance's integers are 64-bit: it would
    enforce the clamped bound, not the one asked), or None."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            numbers = value if key == "enum" and isinstance(value, list) else [value] if key in BOUNDS else []
            if any(isinstance(n, (int, float)) and not isinstance(n, bool) and abs(n) > LIMIT for n in numbers):
                return f"{path}'s {key}"
            if (found := beyond_64_bits(value, f"{path}.{key}")) is not None:
                return found
    elif isinstance(schema, list):
        for number, item in enumerate(schema):
            if (found := beyond_64_bits(item, f"{path}[{number}]")) is not None:
                return found
    return None


def _first_line(text: str) -> str:
    return " ".join(text.strip().splitlines()[0].split())[:240] if text.strip() else "(no reason given)"
