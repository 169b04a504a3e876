"""A conversation held live in the front (``LiveChat``), and what its turn reports to the page:
the events a turn's listeners put out (text, reasoning, tool calls), a call waiting for the page's
approval, the end of a turn, a kept turn as the page shows it. Stop is a flag of the turn's own."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localchat.backends.http import make_client
from localchat.conversation.result import Listeners, TurnResult
from localchat.conversation.stats import stats_line
from localchat.conversation.turn import ChatSession
from localchat.errors import LocalchatError
from localchat.registry import ModelRef, resolve
from localchat.serve.pool.upstream import Upstream
from localchat.store.keeper import SessionSaver

APPROVAL_WAIT_S = 300.0  # a call the page never answers is refused after this long
NOWHERE = "http://127.0.0.1:9/v1"  # a conversation's backend before its first turn: each turn's lease points it


class Stopped(KeyboardInterrupt):
    """The page pressed Stop: the turn ends as Ctrl+C ends it (discarded)."""


@dataclass
class LiveChat:
    uid: str
    model: str
    session: ChatSession
    saver: SessionSaver
    busy: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    decisions: queue.Queue = field(default_factory=queue.Queue)
    always: set[str] = field(default_factory=set)
    say: Callable[[dict[str, Any]], None] = lambda _: None  # the running turn's events (an approval asked)
    last_used: float = field(default_factory=time.monotonic)
    tools_refused: bool = False  # the model's template calls no tools: its conversations have none


def point(backend: Any, upstream: Upstream, model: str) -> None:
    """A conversation's backend aimed at the engine its turn leased (it may be another port than the
    last turn's: a model unloaded when idle comes back on a port of its own)."""
    if backend.client.base_url != upstream.base_url + "/":
        backend.client.close()
        backend.client = make_client(upstream.base_url, upstream.api_key, backend.timeout_s)
    backend.model_field = upstream.model_for(model)


def stop_tools(chat: LiveChat) -> None:
    tools, chat.session.tools = chat.session.tools, None
    if tools is not None:
        tools.close()


def turn_listeners(chat: LiveChat, put: Callable[[dict[str, Any]], None]) -> Listeners:
    stop = chat.stop  # (the turn's own, taken as it begins)

    def checked(event: dict[str, Any] | None) -> None:
        if stop.is_set():
            raise Stopped()
        if event is not None:  # (progress: only a moment to look at Stop)
            put(event)

    return Listeners(on_text=lambda t: checked({"type": "text", "text": t}),
                     on_reasoning=lambda t: checked({"type": "reasoning", "text": t}),
                     on_tool_call=lambda c: checked({"type": "tool_call", "name": c.name, "arguments": c.arguments}),
                     on_progress=lambda p: checked(None))


def approval_asked(chat: LiveChat, name: str, arguments: dict[str, Any]) -> str | None:
    """The page's answer to a tool call (approve, deny, always): None runs it, else the refusal."""
    if name in chat.always:
        return None
    while not chat.decisions.empty():
        chat.decisions.get_nowait()  # (a Stop's or a stale answer)
    if chat.stop.is_set():
        return "the user stopped the reply"
    chat.say({"type": "approve", "name": name, "arguments": arguments})
    try:
        decision = chat.decisions.get(timeout=APPROVAL_WAIT_S)
    except queue.Empty:
        return "the user did not answer in time"
    if decision == "always":
        chat.always.add(name)
    return None if decision in ("approve", "always") else "the user denied this call"


def ended_event(chat: LiveChat, result: TurnResult) -> dict[str, Any]:
    stopped = chat.stop.is_set()
    revision = chat.saver.revision
    note = chat.saver.kept(chat.session) if result.committed else None
    stale = note is not None and chat.saver.stale
    return {"type": "end", "status": "not kept" if stale else "stopped" if stopped else result.status.value,
            "kept": result.committed and not stale, "error": note if stale else result.error, "stale": stale,
            "figures": stats_line(result.stats) if result.stats.ttft_s is not None else None,
            "note": None if stale else note, "turns": len(chat.session.conversation.turns),
            "revision": chat.saver.revision if not stale else revision}


def turn_shown(turn: Any) -> dict[str, Any]:
    return {"user": turn.user, "assistant": turn.assistant, "reasoning": turn.reasoning or None,
            "figures": stats_line(turn.stats) if turn.stats is not None and turn.stats.ttft_s is not None else None,
            "calls": [call for step in turn.steps for call in step.calls],
            "images": [p.ref.label() for p in turn.images]}


def model_backend(name: str) -> tuple[ModelRef | None, Any]:
    """A conversation's server backend for the served model ``name`` (its template and tokenizer
    when the model is on this machine), aimed at no port until a turn's lease points it."""
    from localchat.backends.openai_http import backend_for

    ref = served_ref(name)
    backend = backend_for(NOWHERE, ref, name=name)
    backend.image_tokens = _picture_tokens(ref)
    return ref, backend


def served_ref(name: str | None) -> ModelRef | None:
    """The registry's model of a served name, when it is one (a remote name is not)."""
    try:
        return resolve(name) if name else None
    except LocalchatError:
        return None


def _picture_tokens(ref: ModelRef | None) -> Any:
    """A vision model's pictures counted by its processor, when it is on this machine."""
    from localchat.registry import local_dir
    from localchat.vision.support import has_extra, is_vision

    if ref is None or not has_extra() or not is_vision(ref):
        return None
    try:
        from localchat.vision.counting import local_picture_tokens

        return local_picture_tokens(local_dir(ref))
    except LocalchatError:
        return None
