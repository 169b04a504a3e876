"""JSON answer mode: the schema a reply must follow, the instruction that asks for it, and the check.

A reply that fails the check is shown with the validation error and never enters history; a valid
one is pretty-printed. The default schema is ``{"answer": string}``, asked for with the exact
sentence the bundled demo model was trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat import bounded_json
from localchat.errors import UsageError

DEFAULT_INSTRUCTION = 'Answer in JSON: {"answer": "..."}'
DEFAULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class AnswerSchema:
    schema: dict[str, Any]
    instruction: str
    name: str = "answer"

    def response_format(self) -> dict[str, Any]:
        """OpenAI's structured-output request field; servers that ignore it still get the
        instruction in the system message."""
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": self.schema, "strict": True}}

    def check(self, text: str) -> tuple[Any, str | None]:
        """The parsed reply and None, or None and a one-line reason it is not acceptable."""
        from jsonschema import Draft202012Validator

        try:
            value = bounded_json.loads(_strip_fence(text))
        except ValueError as exc:
            return None, f"not JSON: {exc}"
        error = next(iter(Draft202012Validator(self.schema).iter_errors(value)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the reply"
            return None, f"schema: {where}: {error.message}"
        return value, None


def default_schema() -> AnswerSchema:
    return AnswerSchema(DEFAULT_SCHEMA, DEFAULT_INSTRUCTION)


def load_schema(path: Path) -> AnswerSchema:
    """A JSON Schema file, checked against its metaschema (usage errors otherwise)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        schema = bounded_json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read --json-schema {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"--json-schema {path} is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise UsageError(f"--json-schema {path} must hold a JSON object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise UsageError(f"--json-schema {path} is not a valid JSON Schema: {exc.message}") from None
    compact = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    return AnswerSchema(schema, f"Answer in JSON that matches this JSON Schema: {compact}", path.stem or "answer")


def with_instruction(system: str | None, schema: AnswerSchema | None) -> str | None:
    """The system message with the JSON instruction appended (as the demo model was trained)."""
    if schema is None:
        return system
    return f"{system}\n\n{schema.instruction}" if system else schema.instruction


def pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


def _strip_fence(text: str) -> str:
    """Models often wrap JSON in a Markdown code fence; the JSON inside is what counts."""
    body = text.strip()
    if body.startswith("```") and body.endswith("```") and "\n" in body:
        return body.split("\n", 1)[1].rsplit("```", 1)[0]
    return body
