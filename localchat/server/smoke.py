"""``localchat smoke``: is this OpenAI-compatible server really usable for chat?

Each check is timed; the recall check goes through the same history builder and session as
``localchat chat``. Only the demo model is judged on its answer (other models are reported).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import httpx

from localchat.backends import GenerationParams
from localchat.backends.openai_http import ServerBackend, describe_http_error
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.demo import RECALL, REMEMBER, copyable_code


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


def _timed(name: str, run: Callable[[], tuple[bool, str]], required: bool = True) -> Check:
    started = time.perf_counter()
    try:
        ok, detail = run()
    except httpx.HTTPError as exc:
        ok, detail = False, describe_http_error(exc, name)
    except Exception as exc:  # a smoke test reports every failure as a row, never a traceback
        ok, detail = False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return Check(name, ok, time.perf_counter() - started, detail, required)


def run_smoke(backend: ServerBackend, judge_recall: bool) -> SmokeReport:
    """All checks against the server behind ``backend`` (its client and model field)."""
    client, root = backend.client, backend.url.removesuffix("/v1")
    report = SmokeReport(backend.url, backend.model_id)
    params = GenerationParams(temperature=0.0, max_tokens=32)

    def health():
        r = client.get(f"{root}/health")
        return r.status_code == 200, f"HTTP {r.status_code} {r.text.strip()[:60]}"

    def models():
        r = client.get("models")
        if r.status_code == 200 and not r.content.strip():
            return False, ("HTTP 200 with an empty body (mlx_lm.server does this when the HF cache "
                           "directory is missing, ml-explore/mlx-lm#1636; `localchat serve` creates it)")
        data = r.json().get("data") if r.status_code == 200 else None
        return isinstance(data, list), f"HTTP {r.status_code}, {len(data or [])} models listed"

    def completion():
        r = client.post("chat/completions", json=backend.request_body(
            [{"role": "user", "content": "Hello"}], params, stream=False))
        body = r.json() if r.status_code == 200 else {}
        text = ((body.get("choices") or [{}])[0].get("message") or {}).get("content")
        return isinstance(text, str) and bool(body.get("usage")), f"HTTP {r.status_code}: {text!r}"

    def streaming():
        result = ChatSession(backend, Conversation(), params).ask("Hello")
        s = result.stats
        ok = s.finish_reason in ("stop", "length") and s.ttft_s is not None and not s.estimated
        speed = f"{s.decode_tps:.1f} tok/s" if s.decode_tps else "– tok/s"
        usage = "usage reported" if not s.estimated else "NO usage from the server"
        return ok, f"TTFT {s.ttft_s or 0:.3f}s · {speed} · {usage}: {result.text!r}"

    turn2 = {}

    def recall():
        code = copyable_code(random.Random())
        chat = ChatSession(backend, Conversation(), params)
        first = chat.ask(REMEMBER["en"][0].format(code=code))
        second = chat.ask(RECALL["en"])
        turn2["stats"] = second.stats
        answer = f"told {code!r}, answered {second.text!r}"
        if not first.committed:
            return False, f"turn 1 was not accepted ({first.stats.finish_reason}); {answer}"
        return (second.text == code) if judge_recall else second.accepted, answer

    def cache_hit():
        stats = turn2.get("stats")
        cached = stats.cached_tokens if stats else 0
        return cached > 0, f"turn 2 cached_tokens = {cached} of {stats.prompt_tokens if stats else 0}"

    report.checks = [
        _timed("/health", health),
        _timed("/v1/models", models),
        _timed("completion", completion),
        _timed("streaming + usage", streaming),
        _timed("two-turn recall" + ("" if judge_recall else " (not judged)"), recall),
        _timed("prompt cache hit on turn 2", cache_hit),
    ]
    return report
