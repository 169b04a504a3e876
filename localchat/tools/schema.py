"""A Python function described as a tool: its JSON schema from its signature and type hints, its
description from its docstring.

Types that describe themselves: ``int``, ``float``, ``str``, ``bool``, ``list[T]`` of those, an
``Enum`` or ``Literal`` of values, and ``T | None``; a parameter with a default is optional. A
function that cannot be described (no docstring, a parameter without a hint or of another type,
``*args``/``**kwargs``) is refused with a ``ToolDefinitionError`` naming it and why.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any

SIMPLE = {int: "integer", float: "number", str: "string", bool: "boolean"}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # what every API and template takes as a function name
ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


class ToolDefinitionError(ValueError):
    """A function that cannot be offered as a tool, and why (one line)."""


def describe(function: Callable[..., Any], name: str) -> dict[str, Any]:
    """The OpenAI ``tools`` entry for ``function`` (offered as ``name``)."""
    if not NAME.fullmatch(name):
        raise ToolDefinitionError(f"{name!r}: a tool's name must be letters, digits and '_' (at most 64)")
    doc = inspect.getdoc(function)
    if not doc or not doc.strip():
        raise ToolDefinitionError(f"{name}: it has no docstring (the model reads it to know what the tool does)")
    try:
        hints = typing.get_type_hints(function)
        signature = inspect.signature(function)
    except Exception as exc:  # a hint that names nothing, a builtin without a signature
        raise ToolDefinitionError(f"{name}: its signature cannot be read ({type(exc).__name__}: {exc})") from None
    described = _arguments_described(doc)
    properties, required = {}, []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ToolDefinitionError(f"{name}: *{parameter.name} cannot be described; name every parameter")
        if parameter.name not in hints:
            raise ToolDefinitionError(f"{name}: parameter '{parameter.name}' has no type hint")
        schema = type_schema(hints[parameter.name], f"{name}: parameter '{parameter.name}'")
        if parameter.name in described:
            schema["description"] = described[parameter.name]
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        elif _json_value(parameter.default):
            schema["default"] = _strict_default(parameter.default, f"{name}: parameter '{parameter.name}'")
        properties[parameter.name] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required,
                                  "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": summary(doc), "parameters": parameters}}


def type_schema(hint: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one type hint; ``where`` names the parameter in a refusal."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in SIMPLE:
        return {"type": SIMPLE[hint]}
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        if len(kept) == 1 and len(args) == 2:
            inner = type_schema(kept[0], where)
            optional = {**inner, "type": [inner["type"], "null"]}
            return {**optional, "enum": [*inner["enum"], None]} if "enum" in inner else optional
        raise ToolDefinitionError(f"{where}: a union of {', '.join(map(_named, args))} cannot be described; "
                                  "use one type (or T | None)")
    if origin is list and len(args) == 1:
        return {"type": "array", "items": type_schema(args[0], where)}
    if origin is typing.Literal:
        return _enum_schema(list(args), where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_schema([member.value for member in hint], where)
    raise ToolDefinitionError(f"{where} is a {_named(hint)}: only int, float, str, bool, list[T], an Enum, a "
                              "Literal or T | None can be described")


def _enum_schema(values: list[Any], where: str) -> dict[str, Any]:
    kinds = {SIMPLE.get(type(v)) for v in values}
    if not values or None in kinds or len(kinds) != 1:
        raise ToolDefinitionError(f"{where}: the choices must all be int, float, str or bool of one kind")
    return {"type": kinds.pop(), "enum": values}


def summary(doc: str) -> str:
    """The docstring's text before its ``Args:`` section (the model's description of the tool)."""
    head = re.split(r"^\s*(?:Args|Arguments|Parameters|Returns|Raises)\s*:?\s*$", doc, maxsplit=1, flags=re.M)[0]
    return " ".join(head.split())


def _arguments_described(doc: str) -> dict[str, str]:
    """``name: what it is`` lines of a Google-style ``Args:`` section."""
    parts = re.split(r"^\s*(?:Args|Arguments|Parameters)\s*:?\s*$", doc, maxsplit=1, flags=re.M)
    if len(parts) < 2:
        return {}
    found = {}
    for line in parts[1].splitlines():
        if re.match(r"^\s*(?:Returns|Raises)\s*:?\s*$", line):
            break
        if match := ARG_LINE.match(line):
            found[match[1]] = match[2].strip()
    return found


def _strict_default(value: Any, where: str) -> Any:
    """A default as JSON carries it; NaN, infinity and an integer of thousands of digits are
    refused, naming the parameter (every request would fail to encode them)."""
    value = value.value if isinstance(value, enum.Enum) else value
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, OverflowError) as exc:
        shown = "NaN or infinity" if "float" in str(exc) else "a number too large for JSON"
        raise ToolDefinitionError(f"{where}: its default is {shown}; JSON (and so the model) cannot carry it") from None
    return value


def _json_value(value: Any) -> bool:
    if isinstance(value, enum.Enum):
        value = value.value
    return value is None or isinstance(value, (int, float, str, bool)) or (
        isinstance(value, list) and all(isinstance(v, (int, float, str, bool)) for v in value))


def _named(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
