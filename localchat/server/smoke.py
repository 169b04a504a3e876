"""``localchat smoke``: is this OpenAI-compatible server really usable for chat?

Each check is timed; the recall check goes through the same history builder and session as
``localchat chat``. Only the demo model is judged on its answer (other models are reported).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import httpx

from localchat.backends import GenerationParams
from localchat.backends.http import describe_http_error
from localchat.backends.openai_http import ServerBackend
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession, TurnStatus
from localchat.demo_codes import RECALL, REMEMBER
from localchat.wording import count

# The recall check tests the server (does history reach the model?), not how the demo model copies
# words it never saw: a fixed code it recalls makes the check deterministic. Random held-out codes
# failed now and then ("thunder 42" -> "thundold42", a word the demo model's card lists).
SMOKE_CODE = "harbor 17"
FORMAT_CHECK = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"answer": {"type": "string", "maxLength": 12}}, "required": ["answer"],
    "additionalProperties": False}}}


@dataclass
class Check:
    name: str
    ok: bool
    seconds: float
    detail: str
    required: bool = True


@dataclass
class SmokeReport:
    base_url: str
    model: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks if c.required)

    def as_dict(self) -> dict:
        return {"base_url": self.base_url, "model": self.model, "ok": self.ok,
                "checks": [asdict(c) for c in self.checks]}


def _timed(name: str, url: str, run: Callable[[], tuple[bool, str]], required: bool = True) -> Check:
    started = time.perf_counter()
    try:
        ok, detail = run()
    except httpx.HTTPError as exc:
        ok, detail = False, describe_http_error(exc, url)
    except Exception as exc:  # a smoke test reports every failure as a row, never a traceback
        ok, detail = False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return Check(name, ok, time.perf_counter() - started, detail, required)


def _body(response: httpx.Response) -> str:
    """What a response says, in one short line (an error body is what the user needs to see)."""
    text = " ".join(response.text.split())
    return text[:120] + ("…" if len(text) > 120 else "") if text else "(empty body)"


def _json_object(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def run_smoke(backend: ServerBackend, judge_recall: bool, api: str | None = None,
              judge_tools: bool = False, picture: str | None = None) -> SmokeReport:
    """All checks against the server behind ``backend`` (its client and model field); with
    ``api``, the backend speaks that API and its completion and a tool round trip are checked
    through its SDK (``api_smoke``). With ``picture`` (a vision model's server: mlx_vlm.server) a
    red circle is shown and the answer must start with ``picture`` (any answer when it is ""); the
    prompt cache check is then not required (mlx_vlm.server reports no cached tokens)."""
    client, root = backend.client, backend.url.removesuffix("/v1")
    report = SmokeReport(backend.url, backend.model_id)
    params = GenerationParams(temperature=0.0, max_tokens=32)
    if (nobody := _unreachable(client, root)) is not None:  # said once, not once a check
        report.checks = [Check("the server answers", False, 0.0, nobody, True)]
        return report

    def health():
        r = client.get(f"{root}/health")
        return r.status_code == 200, f"HTTP {r.status_code}: {_body(r)}"

    def models():
        r = client.get("models")
        if r.status_code == 200 and not r.content.strip():
            return False, ("HTTP 200 with an empty body (mlx_lm.server does this when the HF cache "
                           "directory is missing, ml-explore/mlx-lm#1636; `localchat serve` creates it)")
        if r.status_code != 200:
            return False, f"HTTP {r.status_code}: {_body(r)}"
        data = _json_object(r).get("data")
        if not isinstance(data, list):
            return False, f"HTTP 200, but no 'data' list: {_body(r)}"
        return True, f"HTTP 200, {count(len(data), 'model')} listed"

    def completion():
        r = client.post("chat/completions", json=backend.request_body(
            [{"role": "user", "content": "Hello"}], params, stream=False))
        if r.status_code != 200:
            return False, f"HTTP {r.status_code}: {_body(r)}"
        body = _json_object(r)
        choices = body.get("choices") if isinstance(body.get("choices"), list) else []
        message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        text = message.get("content") if isinstance(message, dict) else None
        if not isinstance(text, str):
            return False, f"HTTP 200, but no choices[0].message.content: {_body(r)}"
        usage = "with usage" if isinstance(body.get("usage"), dict) else "NO usage"
        return usage == "with usage", f"HTTP 200, {usage}: {text!r}"

    def streaming():
        result = ChatSession(backend, Conversation.for_backend(backend, None), params).prepare().ask("Hello")
        if result.status in (TurnStatus.ERROR, TurnStatus.INTERRUPTED):
            return False, result.error or result.status.value
        s = result.stats
        speed = f"{s.decode_tps:.1f} tok/s" if s.decode_tps else "– tok/s"
        usage = "NO usage from the server (counts estimated)" if s.estimated else "usage reported"
        return (
            s.ttft_s is not None and not s.estimated,
            f"TTFT {s.ttft_s or 0:.3f}s · {speed} · {usage}: {result.text!r}",
        )

    def answer_format():
        body = {**backend.request_body([{"role": "user", "content": "Answer in JSON: what is 2 + 2?"}],
                                       replace(params, max_tokens=64), stream=False), "response_format": FORMAT_CHECK}
        r = client.post("chat/completions", json=body)
        if r.status_code != 200:
            return False, f"HTTP {r.status_code}: {_body(r)}"
        choices = _json_object(r).get("choices") or [{}]
        text = (choices[0].get("message") or {}).get("content") if isinstance(choices[0], dict) else None
        enforced = r.headers.get("x-localchat-enforced")
        try:
            valid = isinstance(json.loads(text or "").get("answer"), str)
        except (ValueError, AttributeError):
            valid = False
        if valid:
            return True, "valid JSON, " + ("enforced by the server" if enforced else
                                           "though the server does not say it enforces response_format")
        why = "the server said it enforced it" if enforced else "the server ignores response_format"
        return False, f"not the JSON asked for ({why}): {text!r}"

    turn2 = {}

    def recall():
        code = SMOKE_CODE
        chat = ChatSession(backend, Conversation.for_backend(backend, None), params).prepare()
        first = chat.ask(REMEMBER["en"][0].format(code=code))
        if not first.committed:
            return False, f"turn 1 was not accepted ({first.error or first.status.value}): {first.text!r}"
        second = chat.ask(RECALL["en"])
        turn2["stats"] = second.stats
        answer = f"told {code!r}, answered {second.text!r}"
        if second.status is TurnStatus.ERROR:
            return False, f"turn 2 failed: {second.error}"
        return (second.text == code) if judge_recall else (second.accepted and code in second.text), answer

    def cache_hit():
        stats = turn2.get("stats")
        if stats is None:
            return False, "no second turn to look at (the recall check failed first)"
        return stats.cached_tokens > 0, f"turn 2 cached_tokens = {stats.cached_tokens} of {stats.prompt_tokens}"

    def sees():
        from localchat.vision.image import sample_picture

        chat = ChatSession(backend, Conversation.for_backend(backend, None), params).prepare()
        chat.conversation.attached = (sample_picture(),)
        result = chat.ask("What is in the picture?")
        if result.status is TurnStatus.ERROR:
            return False, f"the picture was refused: {result.error}"
        answer = result.text.strip()
        return answer.startswith(picture) and bool(answer), f"shown a red circle, answered {answer!r}"

    endpoint = f"{backend.url}/" + {None: "chat/completions", "anthropic": "messages", "responses": "responses"}[api]
    api_checks = []
    if api is not None:
        from localchat.server import api_smoke

        completion = functools.partial(api_smoke.completion, backend)
        api_checks = [("tool call round trip", endpoint, lambda: api_smoke.tool_round_trip(backend, judge_tools),
                       False)]
    checks = [
        ("/health", f"{root}/health", health),
        ("/v1/models", f"{backend.url}/models", models),
        ("completion", endpoint, completion),
        ("streaming + usage", endpoint, streaming),
        ("two-turn recall" + ("" if judge_recall else " (not required)"), endpoint, recall),
        ("prompt cache hit on turn 2" + ("" if picture is None else " (not required)"), endpoint, cache_hit),
    ]
    if api is None:
        api_checks = [("response_format enforced (not required)", endpoint, answer_format, False)]
    if picture is not None:
        api_checks.insert(0, ("a picture answered", endpoint, sees, True))
    optional = {*(() if judge_recall else (recall,)), *(() if picture is None else (cache_hit,))}
    rows = [_timed(name, url, run, required=run not in optional) for name, url, run in checks]
    rows += [_timed(name, url, run, required) for name, url, run, required in api_checks]
    report.checks = [_redacted(row, backend) for row in rows]
    return report


def _unreachable(client: httpx.Client, root: str) -> str | None:
    """Why nothing can be checked at ``root`` (nothing listens, no answer to connect), or None."""
    try:
        client.get(f"{root}/health")
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return describe_http_error(exc, f"{root}/health")
    except httpx.HTTPError:
        return None  # (something answers: the checks say what is wrong)
    return None


def _redacted(check: Check, backend: ServerBackend) -> Check:
    return Check(check.name, check.ok, check.seconds, backend.redact(check.detail), check.required)
