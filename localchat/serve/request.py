"""What flows through the gateway, whichever API a request came in: the request as chat messages
(``GatewayRequest``), how it ended (``Ended``), and ``ApiError``, which each API writes in its own
error shape. The readers here check a request's fields with their path in the message
(``messages.2.content: must be a string or a list``), so a wrong type is one clear 400.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from localchat import bounded_json
from localchat.backends import GenerationParams, Message
from localchat.conversation.stats import TurnStats

MAX_BODY_BYTES = 10 * 1024 * 1024  # a request over this is refused before it is read whole
NINE_ALNUM = re.compile(r"[A-Za-z0-9]{9}")
MISSING = object()


class ApiError(Exception):
    """A request the gateway refuses, or an upstream that failed: a status and a kind (Anthropic's
    ``invalid_request_error``, ``api_error``…), written in the API's own error shape."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param


def check_key(headers: Any, api_key: str | None) -> None:
    """A 401 unless the request carries the key (``x-api-key`` or ``Authorization: Bearer``), when
    there is one; compared in constant time."""
    if api_key is None:
        return
    import hmac

    given = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
    if not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        raise ApiError(401, "authentication_error", "invalid or missing API key (x-api-key or Authorization: Bearer)")


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, "invalid_request_error", message, param)


@dataclass(frozen=True)
class GatewayRequest:
    """A request as the upstream server takes it: chat messages (system first), sampling, tools."""

    model: str  # as the client named it (echoed back; see ``Upstream.model_for`` for what is sent)
    system: str | None
    messages: list[Message]  # user, assistant (with tool_calls) and tool messages, no system
    params: GenerationParams
    stream: bool
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI function tools
    tool_choice: Any = None  # OpenAI's form, sent on (localchat serve enforces it; plain mlx_lm.server 0.32 does not)
    response_format: dict[str, Any] | None = None  # OpenAI's, sent on: the Responses API's text.format
    stop: tuple[str, ...] = ()  # matched by the gateway, which knows which one stopped the reply
    dropped_tools: tuple[str, ...] = ()  # tools of a kind no local model runs (web search…), left out


@dataclass(frozen=True)
class Ended:
    """How an upstream reply ended: its figures on the one clock, why, and the error if it failed."""

    stats: TurnStats
    finish_reason: str | None  # "stop", "length", "tool_calls"; None when it failed
    stop_sequence: str | None = None  # the client's stop sequence that ended it
    error: str | None = None


@dataclass(frozen=True)
class Idle:
    """Nothing has come from the server for a while (a long prefill): the client hears a ping."""


def arguments_object(text: str) -> dict[str, Any]:
    """A call's arguments (JSON text, as the model wrote them) as an object; none when they are not
    one (not JSON, NaN, a list): a client never gets invalid JSON in a call, and the tool's own
    check then tells the model what is missing."""
    try:
        value = bounded_json.loads(text, strict=True) if text.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def wire_call_id(client_id: str) -> str:
    """A client's tool-call id as the upstream takes it: nine letters and digits (what every chat
    template accepts; Mistral's refuses anything else), the same for a call and for its result."""
    if NINE_ALNUM.fullmatch(client_id):
        return client_id
    return hashlib.sha256(client_id.encode("utf-8", "surrogatepass")).hexdigest()[:9]


# --- reading a request's fields ---------------------------------------------------------------------------

TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
              dict: "an object"}


def read(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], path: str = "", *, required: bool = False,
         default: Any = None) -> Any:
    """``obj[key]`` when it is of ``kind`` (a bool is never a number); ``default`` when absent or null."""
    where = f"{path}.{key}" if path else key
    value = obj.get(key, MISSING)
    if value is MISSING or value is None:
        if required:
            raise invalid(f"{where}: Field required", where)
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    numeric = float in kinds and isinstance(value, int) and not isinstance(value, bool)
    if not (numeric or (isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds))):
        wanted = " or ".join(TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise invalid(f"{where}: must be {wanted}, not {type(value).__name__}", where)
    return value


def read_number(obj: dict[str, Any], key: str, low: float, high: float, path: str = "") -> float | None:
    value = read(obj, key, float, path)
    if value is not None and not low <= value <= high:
        where = f"{path}.{key}" if path else key
        raise invalid(f"{where}: must be between {low:g} and {high:g}", where)
    return value


def read_count(obj: dict[str, Any], key: str, path: str = "", *, required: bool = False, low: int = 1) -> int | None:
    value = read(obj, key, int, path, required=required)
    if value is not None and value < low:
        where = f"{path}.{key}" if path else key
        raise invalid(f"{where}: must be at least {low}", where)
    return value


def items_of(obj: dict[str, Any], key: str, path: str = "", *, required: bool = False) -> list[tuple[str, dict]]:
    """``obj[key]`` as (path, object) pairs: a list whose every entry is an object."""
    where = f"{path}.{key}" if path else key
    entries = read(obj, key, list, path, required=required, default=[])
    pairs = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise invalid(f"{where}.{index}: must be an object, not {type(entry).__name__}", f"{where}.{index}")
        pairs.append((f"{where}.{index}", entry))
    return pairs


def function_tool(name: Any, description: Any, schema: Any, path: str) -> dict[str, Any]:
    """An OpenAI function tool, its fields checked."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", name):
        raise invalid(f"{path}.name: must be 1 to 128 letters, digits, '_', '-', '.' or ':'", f"{path}.name")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{path}.description: must be a string", f"{path}.description")
    schema = {"type": "object", "properties": {}} if schema is None else schema
    if not isinstance(schema, dict):
        raise invalid(f"{path}: the input schema must be an object", path)
    return {"type": "function", "function": {"name": name, "description": description or "", "parameters": schema}}


def joined_calls(messages: list[Message]) -> list[Message]:
    """Consecutive assistant messages made one (text, then its calls): chat templates and
    mlx_lm.server expect one assistant message a turn."""
    out: list[Message] = []
    for message in messages:
        last = out[-1] if out else None
        if last is not None and last["role"] == message["role"] == "assistant" and not last.get("tool_calls"):
            merged = {**last, **message, "content": (last.get("content") or "") + (message.get("content") or "")}
            out[-1] = merged
        else:
            out.append(message)
    return out


def check_results_follow_calls(messages: list[Message], result_name: str, call_name: str) -> None:
    """Every tool result answers a call made before it, once."""
    open_calls: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or ():
            open_calls.add(call["id"])
        if message["role"] == "tool":
            if message["tool_call_id"] not in open_calls:
                raise invalid(f"a {result_name} answers {message.get('_client_id', message['tool_call_id'])!r}, "
                              f"but no {call_name} before it has that id")
            open_calls.discard(message["tool_call_id"])
    for message in messages:
        message.pop("_client_id", None)


def picture_part(data: bytes | str, where: str) -> dict[str, Any]:
    """A client's picture (its bytes, or a base64 data URL), checked as ``--image`` checks a file,
    as the OpenAI content part every backend sends; a bad one is the client's 400."""
    from localchat.errors import UsageError
    from localchat.vision.image import bytes_of_data_url, picture_from_bytes
    from localchat.vision.support import has_extra

    if not has_extra():
        raise invalid(f"{where}: pictures need localchat's vision extra (mlx-vlm) where the gateway runs", where)
    try:
        raw = bytes_of_data_url(data) if isinstance(data, str) else data
        return picture_from_bytes(raw, "the picture", where).part()
    except UsageError as exc:
        raise invalid(str(exc), where) from None


def joined_content(first: str | list[dict[str, Any]], second: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Two user messages' contents as one: text joined by a blank line, pictures kept in order."""
    if isinstance(first, str) and isinstance(second, str):
        return first + "\n\n" + second

    def parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)

    return [*parts(first), *parts(second)]


def content_of(parts: list[dict[str, Any]], joiner: str = "\n\n") -> str | list[dict[str, Any]]:
    """A message's content from its parts in order: the texts joined when there is no picture,
    else the parts themselves (OpenAI's shape)."""
    if all(part["type"] == "text" for part in parts):
        return joiner.join(part["text"] for part in parts)
    return parts


async def aclose(items: AsyncIterator[Any]) -> None:
    """End an async generator of events early (its upstream request closes with it)."""
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


def effort_budget(effort: str | None, where: str) -> Any:
    """A reasoning effort as a thinking budget (``grammar.think_budget.EFFORT_BUDGETS``), or a 400."""
    from localchat.grammar.think_budget import budget_of_effort

    if effort is None:
        return None
    try:
        return budget_of_effort(effort)
    except ValueError as exc:
        raise invalid(f"{where}: {exc}", where) from None
