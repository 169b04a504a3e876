"""What an answer must be: JSON valid against a schema, text matching a regular expression, or one of
a few choices; the instruction that asks for it, and the check a reply passes before it is kept.

In-process the answer is also decoded under the format (``localchat.grammar``): only tokens that
keep it a valid prefix are allowed. Over HTTP the format is sent as the server's own request field
(``response_format`` for JSON; vLLM's ``guided_regex`` and ``guided_choice``) and the reply is still
checked here, since a server may ignore the field (mlx_lm.server does). The default schema is
``{"answer": string}``, asked for with the exact sentence the bundled demo model was trained on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat import bounded_json
from localchat.bounded_schema import CHECK_BUDGET_S, CheckTimeout, Deadline, schema_errors
from localchat.errors import UsageError
from localchat.files import read_text

DEFAULT_INSTRUCTION = 'Answer in JSON: {"answer": "..."}'
DEFAULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
MAX_CHOICES = 1000
LEADING = re.compile(r"^[ \t\n]{0,4}")  # what the grammar lets come before an answer after reasoning
MAX_PATTERN_CHARS = 2000
MAX_PATTERN_SIZE = 100_000  # what a pattern may unroll to: a{1000000000} would take 24 GB to compile
REPEAT_COUNT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


@dataclass(frozen=True)
class AnswerFormat:
    instruction: str
    schema: dict[str, Any] | None = None  # JSON: the schema a reply must be valid against
    name: str = "answer"
    pattern: str | None = None  # a regular expression the whole reply must match
    choices: tuple[str, ...] = field(default=())  # the reply is exactly one of these

    @property
    def kind(self) -> str:
        return "json" if self.schema is not None else "regex" if self.pattern is not None else "choice"

    def described(self) -> str:
        """For messages: ``the JSON Schema person``, ``--regex …``, ``--choice yes,no``."""
        return {"json": f"the JSON Schema {self.name}", "regex": f"--regex {self.pattern}",
                "choice": f"--choice {','.join(self.choices)}"}[self.kind]

    def response_format(self) -> dict[str, Any] | None:
        """OpenAI's structured-output field (JSON only); servers that ignore it still get the instruction."""
        if self.schema is None:
            return None
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": self.schema, "strict": True}}

    def request_fields(self) -> dict[str, Any]:
        """What a request carries to ask a server to enforce the format while decoding."""
        if self.schema is not None:
            return {"response_format": self.response_format()}
        if self.pattern is not None:
            return {"guided_regex": self.pattern}  # vLLM's
        return {"guided_choice": list(self.choices)}

    def check(self, text: str) -> tuple[Any, str | None]:
        """The parsed reply and None, or None and a one-line reason it is not acceptable (one whose
        patterns take over ``CHECK_BUDGET_S`` to test is not acceptable either)."""
        try:
            return self._check(text, Deadline())
        except CheckTimeout:
            return None, f"testing it against {self.described()} took over {CHECK_BUDGET_S:g} s " \
                "(a pattern that backtracks)"

    def _check(self, text: str, deadline: Deadline) -> tuple[Any, str | None]:
        if self.pattern is not None:  # the line breaks a thinking model writes after its reasoning aside
            matched = deadline.fullmatch(self.pattern, text) or deadline.fullmatch(self.pattern, LEADING.sub("", text))
            return (text, None) if matched else (None, f"it does not match {self.pattern}")
        if self.schema is None:
            shown = ", ".join(self.choices)
            return (text.strip(), None) if text.strip() in self.choices else (None, f"it is not one of: {shown}")
        try:
            value = bounded_json.loads(_strip_fence(text), strict=True)
        except ValueError as exc:
            return None, f"not JSON: {exc}"
        error = next(schema_errors(self.schema, value, deadline, formats=True), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the reply"
            return None, f"schema: {where}: {error.message}"
        return value, None


def default_schema() -> AnswerFormat:
    return AnswerFormat(DEFAULT_INSTRUCTION, DEFAULT_SCHEMA)


def load_schema(path: Path) -> AnswerFormat:
    """A JSON Schema file, checked against its metaschema (usage errors otherwise)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        schema = bounded_json.loads(read_text(path))
    except OSError as exc:
        raise UsageError(f"cannot read --json-schema {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"--json-schema {path} is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise UsageError(f"--json-schema {path} must hold a JSON object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the schema"
        raise UsageError(f"--json-schema {path} is not a valid JSON Schema ({where}): {exc.message[:200]}") from None
    except RecursionError:
        raise UsageError(f"--json-schema {path} is nested too deep to check") from None
    compact = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    return AnswerFormat(f"Answer in JSON that matches this JSON Schema: {compact}", schema, name=path.stem or "answer")


def regex_format(pattern: str) -> AnswerFormat:
    """``--regex PATTERN``: the whole answer matches it (the ``regex`` module, as Python reads the
    pattern, checks every reply, in bounded time: ``localchat.bounded_schema``)."""
    if not pattern or len(pattern) > MAX_PATTERN_CHARS:
        raise UsageError(f"--regex must be a pattern of 1 to {MAX_PATTERN_CHARS} characters")
    if (size := unrolled_size(pattern)) > MAX_PATTERN_SIZE:
        raise UsageError(f"--regex {pattern[:80]!r} unrolls to {size:,} steps, past the {MAX_PATTERN_SIZE:,} a "
                         "pattern may take (count a repeat with * or +, or use a smaller {n})")
    import regex

    try:
        regex.compile(pattern)
    except regex.error as exc:
        raise UsageError(f"--regex {pattern!r} is not a regular expression: {exc}") from None
    return AnswerFormat(f"Answer with text that matches the regular expression {pattern}", pattern=pattern)


def unrolled_size(pattern: str) -> int:
    """How many steps the pattern unrolls to (each bounded repeat ``{m,n}`` copies its part n
    times; ``*`` and ``+`` loop without copying), as Python's own parser reads it; a pattern it
    cannot read (the ``regex`` module's own syntax) is judged by its largest ``{n}``."""
    import re._constants as constants
    import re._parser as parser

    def size(items: Any) -> int:
        total = 0
        for op, arg in items:
            if op in (constants.MAX_REPEAT, constants.MIN_REPEAT, constants.POSSESSIVE_REPEAT):
                low, high, inner = arg
                total += size(inner) * max(1, low if high == constants.MAXREPEAT else high)
            elif op is constants.BRANCH:
                total += sum(size(branch) for branch in arg[1])
            elif op in (constants.SUBPATTERN, constants.ATOMIC_GROUP):
                total += size(arg[-1])
            elif op in (constants.ASSERT, constants.ASSERT_NOT):
                total += size(arg[1])
            else:
                total += 1
            if total > MAX_PATTERN_SIZE:
                return total  # (enough to refuse: no need to multiply further)
        return total

    try:
        return size(parser.parse(pattern))
    except (re.error, RecursionError, OverflowError, TypeError, ValueError):
        counts = [int(n or 0) for m in REPEAT_COUNT.finditer(pattern) for n in m.groups()]
        return max([len(pattern), *counts])


def choice_format(text: str) -> AnswerFormat:
    """``--choice yes,no,unsure``: the answer is exactly one of them."""
    choices = tuple(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    if len(choices) < 2 or len(choices) > MAX_CHOICES:
        raise UsageError(f"--choice takes 2 to {MAX_CHOICES} answers, separated by commas (e.g. yes,no,unsure)")
    return AnswerFormat(f"Answer with exactly one of: {', '.join(choices)}", choices=choices, name="choice")


def with_instruction(system: str | None, schema: AnswerFormat | None) -> str | None:
    """The system message with the format's instruction appended (as the demo model was trained)."""
    if schema is None:
        return system
    return f"{system}\n\n{schema.instruction}" if system else schema.instruction


def pretty(value: Any, as_json: bool = True) -> str:
    """An accepted answer as printed: JSON (a string answer too, quoted: it is a JSON string), or
    the text itself for ``--regex`` and ``--choice``."""
    return json.dumps(value, ensure_ascii=False, indent=2) if as_json else str(value)


def _strip_fence(text: str) -> str:
    """Models often wrap JSON in a Markdown code fence; the JSON inside is what counts."""
    body = text.strip()
    if body.startswith("```") and body.endswith("```") and "\n" in body:
        return body.split("\n", 1)[1].rsplit("```", 1)[0]
    return body
