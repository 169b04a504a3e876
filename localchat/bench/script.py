"""Bench scripts: scripted conversations in YAML, validated once, with seeded variables.

    name: recall-en                      # optional, defaults to the file name
    system: You are a helpful assistant. # optional
    vars:                                # drawn afresh for every conversation of every repeat
      code: {generate: code, script: en}            # a demo-style code ("harbor 17")
      old: {generate: choice, from: [Monday, Friday]}
      new: {generate: choice, from: [Monday, Friday], unlike: old}
    conversations:
      - turns:
          - user: Remember the code {code}. Reply only OK.
          - user: What was the code? Reply with the code only.
            expect: "{code}"                 # scored: exact match (after trimming spaces)
          - user: And at what time?
            expect_regex: "(?i)i don't know"  # scored: regular expression (full match)

Every arm of a run sees the same draws: they depend only on (seed, script, repeat, conversation).
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.demo_codes import random_code
from localchat.errors import UsageError
from localchat.yamlfile import read_yaml

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
GENERATORS = {"code", "choice"}


FACTS = ("early", "recent")  # what a scored turn asks about: a fact told long ago, or lately


@dataclass(frozen=True)
class ScriptTurn:
    user: str
    expect: str | None = None
    expect_regex: str | None = None
    fact: str | None = None  # early | recent: the policy bench scores the two apart
    pin: str | None = None  # what the pin policy pins when this turn is asked

    @property
    def scored(self) -> bool:
        return self.expect is not None or self.expect_regex is not None


@dataclass(frozen=True)
class BenchScript:
    name: str
    path: str
    system: str | None
    variables: dict[str, dict[str, Any]]
    conversations: tuple[tuple[ScriptTurn, ...], ...]


@dataclass(frozen=True)
class PlannedTurn:
    """One turn with its variables filled in."""

    user: str
    expect: str | None
    expect_regex: str | None
    fact: str | None = None
    pin: str | None = None

    @property
    def scored(self) -> bool:
        return self.expect is not None or self.expect_regex is not None

    def is_correct(self, answer: str) -> bool | None:
        if self.expect is not None:
            return answer.strip() == self.expect.strip()
        if self.expect_regex is not None:
            return re.fullmatch(self.expect_regex, answer.strip()) is not None
        return None


def _bad(path: Path, where: str, message: str) -> UsageError:
    return UsageError(f"{path}: {where}: {message}")


def _parse_turn(raw: Any, path: Path, where: str) -> ScriptTurn:
    if not isinstance(raw, dict) or not isinstance(raw.get("user"), str) or not raw["user"].strip():
        raise _bad(path, where, "a turn needs a non-empty 'user' text")
    unknown = set(raw) - {"user", "expect", "expect_regex", "score", "fact", "pin"}
    if unknown:
        raise _bad(path, where, f"unknown field '{sorted(unknown)[0]}'")
    expect, regex = raw.get("expect"), raw.get("expect_regex")
    if raw.get("score") and expect is None and regex is None:
        raise _bad(path, where, "a scored turn needs 'expect' or 'expect_regex'")
    for name, value in (("expect", expect), ("expect_regex", regex)):
        if value is not None and not isinstance(value, (str, int, float)):
            raise _bad(path, where, f"'{name}' must be text")
    if regex is not None:
        try:
            re.compile(str(regex))
        except re.error as exc:
            raise _bad(path, where, f"'expect_regex' is not a valid regular expression ({exc})") from None
    if raw.get("fact") is not None and (raw["fact"] not in FACTS or (expect is None and regex is None)):
        raise _bad(path, where, f"'fact' is one of {', '.join(FACTS)}, on a scored turn")
    if raw.get("pin") is not None and (not isinstance(raw["pin"], str) or not raw["pin"].strip()):
        raise _bad(path, where, "'pin' must be a non-empty text")
    return ScriptTurn(raw["user"], None if expect is None else str(expect), None if regex is None else str(regex),
                      fact=raw.get("fact"), pin=raw.get("pin"))


def _check_variables(raw: Any, path: Path) -> dict[str, dict[str, Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _bad(path, "vars", "must be a mapping of name → {generate: …}")
    for name, spec in raw.items():
        if not isinstance(spec, dict) or spec.get("generate") not in GENERATORS:
            raise _bad(path, f"vars.{name}", f"'generate' must be one of {sorted(GENERATORS)}")
        if spec["generate"] == "choice" and not (isinstance(spec.get("from"), list) and spec["from"]):
            raise _bad(path, f"vars.{name}", "'choice' needs a non-empty 'from' list")
        if spec["generate"] == "choice" and not all(isinstance(o, (str, int, float)) for o in spec["from"]):
            raise _bad(path, f"vars.{name}", "'from' must list texts or numbers")
        if spec["generate"] == "code" and spec.get("script", "en") not in ("en", "zh"):
            raise _bad(path, f"vars.{name}", "'script' must be en or zh")
    for name, spec in raw.items():
        _check_unlike(name, spec, raw, path)
    return raw


def _check_unlike(name: str, spec: dict[str, Any], variables: dict[str, dict[str, Any]], path: Path) -> None:
    """``unlike: other`` must name a variable drawn earlier, and leave a choice whatever it drew."""
    other = spec.get("unlike")
    if other is None:
        return
    earlier = list(variables)[:list(variables).index(name)]
    if spec["generate"] != "choice" or other not in earlier:
        raise _bad(path, f"vars.{name}", "'unlike' goes on a 'choice' and names a variable defined above it")
    options = {str(o) for o in spec["from"]}
    drawn = variables[other]
    for value in ({str(o) for o in drawn["from"]} if drawn["generate"] == "choice" else {None}):
        if not options - {value}:
            raise _bad(path, f"vars.{name}", f"'unlike: {other}' leaves no choice when {other} is {value!r}")


def load_script(path: Path) -> BenchScript:
    """Read and validate a script; every problem is one line naming the file and place."""
    data = read_yaml(path, UsageError)
    if not isinstance(data, dict) or not isinstance(data.get("conversations"), list) or not data["conversations"]:
        raise _bad(path, "top level", "expected a mapping with a non-empty 'conversations' list")
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise _bad(path, "system", "must be text")
    variables = _check_variables(data.get("vars"), path)
    conversations = []
    for c, conv in enumerate(data["conversations"], 1):
        turns = conv.get("turns") if isinstance(conv, dict) else None
        if not isinstance(turns, list) or not turns:
            raise _bad(path, f"conversation {c}", "needs a non-empty 'turns' list")
        conversations.append(tuple(_parse_turn(t, path, f"conversation {c}, turn {i}")
                                   for i, t in enumerate(turns, 1)))
    script = BenchScript(str(data.get("name") or path.stem), str(path), system, variables, tuple(conversations))
    _check_placeholders(script, path)
    return script


def _check_placeholders(script: BenchScript, path: Path) -> None:
    names = set(script.variables)
    for c, turns in enumerate(script.conversations, 1):
        for i, turn in enumerate(turns, 1):
            for text in (turn.user, turn.expect or "", turn.expect_regex or "", turn.pin or ""):
                for used in re.findall(r"\{(\w+)\}", text):
                    if used not in names:
                        raise _bad(path, f"conversation {c}, turn {i}", f"unknown variable {{{used}}}")


def draw_variables(script: BenchScript, seed: int, repeat: int, conversation: int) -> dict[str, str]:
    """The same values for every arm: seeded by (seed, script name, repeat, conversation)."""
    key = f"{seed}/{script.name}/{repeat}/{conversation}".encode()
    rng = random.Random(zlib.crc32(key))
    values: dict[str, str] = {}
    for name, spec in script.variables.items():
        if spec["generate"] == "code":
            values[name] = random_code(rng, spec.get("script", "en"), "heldout")
        else:
            options = [str(o) for o in spec["from"] if str(o) != values.get(spec.get("unlike", ""))]
            values[name] = rng.choice(options)
    return values


def plan(script: BenchScript, seed: int, repeat: int, conversation: int) -> list[PlannedTurn]:
    values = draw_variables(script, seed, repeat, conversation)

    def fill(text: str | None) -> str | None:
        if text is None:
            return None
        return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)

    def fill_regex(pattern: str | None) -> str | None:
        if pattern is None:
            return None
        return re.sub(r"\{(\w+)\}", lambda m: re.escape(values[m.group(1)]) if m.group(1) in values else m.group(0),
                      pattern)

    return [PlannedTurn(fill(t.user) or "", fill(t.expect), fill_regex(t.expect_regex), fact=t.fact, pin=fill(t.pin))
            for t in script.conversations[conversation]]


def script_from_session(name: str, system: str | None, user_turns: list[str]) -> BenchScript:
    """A saved session replayed as a script: the same user turns, in one conversation, unscored
    (what it costs and how answers differ between arms, on the user's own conversation)."""
    if not user_turns:
        raise UsageError(f"saved session '{name}' has no turns to replay")
    return BenchScript(f"replay-{name}", f"session:{name}", system, {},
                       (tuple(ScriptTurn(text) for text in user_turns),))


def builtin_scripts(long: bool = False) -> list[Path]:
    """The default scripts (written for the demo model); ``long/`` holds the long conversations the
    policy bench plays, ``real/`` ones for real assistants."""
    return sorted((SCRIPTS_DIR / "long" if long else SCRIPTS_DIR).glob("*.yaml"))


def script_path(given: Path) -> Path:
    """A script file, or the name of a built-in one (``name-recall``, ``recall-en``)."""
    if given.exists() or given.suffix or len(given.parts) > 1:
        return given
    found = sorted(SCRIPTS_DIR.rglob(f"{given.name}.yaml"))
    return found[0] if found else given
