"""The page's conversations, held in the front: each one a ``ChatSession`` on the server backend
(the one client path ``chat --backend server`` takes), kept in the conversation log by the
``SessionSaver`` the terminal uses. A conversation started in the terminal is continued here by its
id, and the other way round.

Each turn reaches its model as every API's request does: by a lease from the pool (loading the model
first when it must, said to the page as ``model_loader``), given back when the turn ends. Opening or
viewing a conversation starts nothing: its tools (and MCP servers) start with the first turn that
offers them and stop once it has been idle for the keep-alive, or is closed.

A turn runs in a worker thread and reports what happens as plain dicts (``TurnEvents``): the
answer's text, reasoning, tool calls (each waiting for the page's approval), and at the end its
status, figures and whether it was kept. Stop sets a flag the listeners read: the reply is then
discarded as Ctrl+C discards it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from localchat.chosen_settings import chosen_params
from localchat.conversation.history import Conversation
from localchat.conversation.result import Listeners, TurnResult
from localchat.conversation.turn import ChatSession
from localchat.errors import LocalchatError, UsageError
from localchat.sampling import check_setting
from localchat.serve.page.live import (
    LiveChat,
    approval_asked,
    ended_event,
    model_backend,
    point,
    served_ref,
    stop_tools,
    turn_listeners,
    turn_shown,
)
from localchat.serve.pool.lease import Lease
from localchat.store.keeper import SessionSaver, saved_state
from localchat.store.saved_sessions import KEEPING_BUSY_TIMEOUT_S, SessionNotFound, SessionStore, default_store

IDLE_LOOK_S = 1.0  # how often conversations idle past the keep-alive have their tools stopped


@dataclass
class WebChats:
    lease: Callable[[str], Lease]  # the pool's: a model's engine for one turn (loaded first if it must be)
    served: Callable[[], list[str]]  # the models this port serves
    tools: Callable[[Callable[[str, dict[str, Any]], str | None]], Any] | None = None  # a ToolRunner, given an asker
    keep_alive: float | None = 300.0  # a conversation's tools stop after this long idle (None: never)
    loaded: Callable[[str], bool] = lambda _: True  # whether a model is loaded now (else a turn says it loads)
    store: SessionStore = field(default_factory=lambda: default_store(KEEPING_BUSY_TIMEOUT_S))
    live: dict[str, LiveChat] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    # tool processes are started from one long-lived thread: on Linux a child's parent-death signal
    # fires when the *thread* that started it ends, and a turn's thread ends with the turn
    _starter: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "page-tools-starter"))

    def __post_init__(self) -> None:
        if self.tools is not None and self.keep_alive is not None:
            threading.Thread(target=self._stop_idle_tools, name="page-tools-idle", daemon=True).start()

    # --- the list and one conversation -------------------------------------------------------

    def listed(self, query: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        from localchat.store.conversation_log import recent, search

        if not self.store.path.exists():
            return []
        with self.store.connect() as conn:
            if query:
                return [{"id": h.uid, "title": h.line, "model": h.model, "updated": h.time} for h in
                        _unique(search(conn, query, limit=limit))]
            return [{"id": c.uid, "title": " ".join(c.first.split())[:80], "model": c.model, "updated": c.updated,
                     "turns": c.turns} for c in recent(conn, limit=limit)]

    def shown(self, uid: str) -> dict[str, Any]:
        chat = self.opened(uid)
        session = chat.session
        return {"id": chat.uid, "model": chat.model, "system": session.conversation.system,
                "temperature": session.params.temperature, "history": session.use_history,
                "turns": [turn_shown(t) for t in session.conversation.turns]}

    def opened(self, uid: str) -> LiveChat:
        """A conversation of this page, or one of the log (a terminal's), brought back; a live one
        whose stored state another page, tab or terminal has moved on since is read again (unless
        it is answering), so it always shows, and goes on from, the latest kept turn."""
        with self._lock:
            chat = self.live.get(uid)
        if chat is not None:
            if chat.busy.locked() or self.store.revision_of(uid) in (None, chat.saver.revision):
                return chat
            self._dropped(chat)
        try:
            saved = self.store.load(uid)
        except (SessionNotFound, UsageError):
            raise SessionNotFound(f"no conversation {uid!r} in the log") from None
        try:
            model = self._served_name(saved.model)
        except UsageError:  # a conversation of a model not served here goes on with the first one served
            model = self.served()[0]
        chat = self._made(uid, model, saved.system, dict(saved.params), saved.turns, saved)
        with self._lock:
            held = self.live.setdefault(uid, chat)
        if held is not chat:  # (another request made it first: one live chat a conversation)
            self._closed(chat)
        return held

    def _dropped(self, chat: LiveChat) -> None:
        """A live chat out of the page's hands (it is read again from the store when next opened)."""
        with self._lock:
            if self.live.get(chat.uid) is chat:
                del self.live[chat.uid]
        self._closed(chat)

    @staticmethod
    def _closed(chat: LiveChat) -> None:
        chat.stop.set()
        chat.decisions.put("deny")
        chat.session.backend.close()
        stop_tools(chat)

    def started(self, model: str | None, system: str | None, temperature: float | None,
                history: bool = True) -> LiveChat:
        from localchat.conversation.records import new_session_id

        name = self._served_name(model)
        ref = served_ref(name)
        system = system if system is not None else (ref.default("system") if ref else None)
        params = {"temperature": temperature} if temperature is not None else {}
        chat = self._made(new_session_id(), name, system or None, params, (), None)
        chat.session.use_history = history
        with self._lock:
            self.live[chat.uid] = chat
        return chat

    def _served_name(self, model: str | None) -> str:
        served = self.served()
        if model in served or model is None and served:
            return model or served[0]
        ref = served_ref(model) if model else None
        if ref is not None and ref.id in served:
            return ref.id
        raise UsageError(f"model {model!r} is not served here: {', '.join(served)}")

    def _made(self, uid: str, model: str, system: str | None, params: dict[str, Any], turns: tuple,
              saved: Any) -> LiveChat:
        ref, backend = model_backend(model)
        session = ChatSession(backend=backend, conversation=Conversation.for_backend(backend, system, turns),
                              params=chosen_params(ref, {}, params))
        if saved is not None:
            session.conversation.pins = list(saved.pins)
        saver = SessionSaver(self.store, uid, model, name=saved.name if saved else None, logging=True,
                             revision=saved.revision if saved else 0,
                             saved_state=saved_state(saved) if saved else None)
        saver.start(session)
        return LiveChat(uid=uid, model=model, session=session, saver=saver)

    # --- turns -----------------------------------------------------------------------------------

    def turn(self, uid: str, kind: str, text: str = "", pictures: tuple = ()) -> Iterator[dict[str, Any]]:
        """``ask`` a question, ``retry`` the last one, or ``edit`` it (taken back, then asked anew):
        the turn's events as they come, in order, then its end."""
        chat = self.opened(uid)
        if not chat.busy.acquire(blocking=False):
            raise UsageError("this conversation is answering already: stop it first")
        events: queue.Queue = queue.Queue()
        stop = chat.stop = threading.Event()  # this turn's own: a stop of an abandoned turn never reaches the next
        chat.say = events.put

        def run() -> None:
            try:
                ended = ended_event(chat, self._leased(chat, kind, text, pictures, events))
                if ended.get("stale"):
                    self._dropped(chat)  # (built on an old state: the next open reads the latest)
                events.put(ended)
            except (LocalchatError, ValueError) as exc:
                events.put({"type": "error", "message": str(exc)})
            except Exception as exc:  # never a traceback in the page, never a stuck conversation
                events.put({"type": "error", "message": f"unexpected {type(exc).__name__}: {exc}"})
            finally:
                chat.busy.release()
                events.put(None)

        threading.Thread(target=run, name=f"web-turn-{uid[:8]}", daemon=True).start()
        ended = False
        try:
            while (event := events.get()) is not None:
                yield event
            ended = True
        finally:
            if not ended:
                stop.set()  # the page went away mid-reply: its turn is discarded, as Stop does
                chat.decisions.put("deny")  # (a call waiting for its approval is denied at once)

    def _leased(self, chat: LiveChat, kind: str, text: str, pictures: tuple, events: queue.Queue) -> TurnResult:
        """The turn on its model's engine, leased for it (the page hears that it loads first)."""
        if not self.loaded(chat.model):
            events.put({"type": "loading", "model": chat.model})
        lease = self.lease(chat.model)
        try:
            point(chat.session.backend, lease.upstream, chat.model)
            self._ready_tools(chat)
            return self._run(chat, kind, text, pictures, events)
        finally:
            chat.last_used = time.monotonic()
            lease.release()

    def _ready_tools(self, chat: LiveChat) -> None:
        """The conversation's tools, started with its first turn (again after an idle stop)."""
        session = chat.session
        if self.tools is None or session.tools is not None or chat.tools_refused:
            return
        tools = self._starter.submit(self.tools, lambda name, args: approval_asked(chat, name, args)).result()
        try:
            session.backend.offer_tools(tools.specs)
        except LocalchatError:  # a model whose template calls no tools: its conversations have none
            tools.close()
            chat.tools_refused = True
            return
        session.tools = tools

    def _stop_idle_tools(self) -> None:
        while not self._closing.wait(IDLE_LOOK_S):
            now = time.monotonic()
            with self._lock:
                chats = list(self.live.values())
            for chat in chats:
                idle = self.keep_alive is not None and now - chat.last_used >= self.keep_alive
                if idle and chat.session.tools is not None and chat.busy.acquire(blocking=False):
                    try:
                        stop_tools(chat)
                    finally:
                        chat.busy.release()

    def _run(self, chat: LiveChat, kind: str, text: str, pictures: tuple, events: queue.Queue) -> TurnResult:
        session = chat.session
        heard = turn_listeners(chat, events.put)
        if kind == "retry":
            return session.retry(heard)
        if kind == "edit":
            if not session.conversation.turns:
                raise UsageError("nothing to edit: no question has been answered and kept yet")
            last = session.conversation.take_back()
            result = self._asked(session, text, pictures or last.images, heard)
            if not result.committed:
                session.conversation.put_back(last)
            return result
        return self._asked(session, text, pictures, heard)

    def _asked(self, session: ChatSession, text: str, pictures: tuple, listeners: Listeners) -> TurnResult:
        count = getattr(session.backend, "image_tokens", None)
        session.conversation.attached = tuple(p.with_tokens(count(p.data)) for p in pictures) if count else pictures
        return session.ask(text, listeners)

    def stop(self, uid: str) -> bool:
        chat = self.opened(uid)
        chat.stop.set()
        chat.decisions.put("deny")  # a call waiting for approval is answered at once
        return chat.busy.locked()

    def decide(self, uid: str, decision: str) -> None:
        if decision not in ("approve", "deny", "always"):
            raise UsageError("a decision is approve, deny or always")
        self.opened(uid).decisions.put(decision)

    def undo(self, uid: str) -> dict[str, Any]:
        chat = self._idle(uid)
        if not chat.session.conversation.turns:
            raise UsageError("nothing to undo")
        chat.session.conversation.take_back()
        chat.saver.kept(chat.session, taken_back=1)
        return self.shown(uid)

    def settings(self, uid: str, *, system: Any = None, temperature: Any = None, history: Any = None,
                 model: Any = None) -> dict:
        chat = self._idle(uid)
        if model is not None:
            self._switched(chat, model)
        session = chat.session
        if history is not None:
            if not isinstance(history, bool):
                raise UsageError("history is true or false")
            session.use_history = history
        if temperature is not None:
            session.params = replace(session.params, temperature=check_setting("temperature", temperature))
        if system is not None:
            if not isinstance(system, str) or len(system) > 20_000:
                raise UsageError("the system message is text of at most 20,000 characters")
            session.set_system(system or None)
        chat.saver.kept(session)  # (the conversation's own from now on: kept as a turn is)
        return self.shown(uid)

    def _switched(self, chat: LiveChat, model: Any) -> None:
        """The open conversation goes on with another served model: its turns kept (the log keeps
        which model said each), its tools offered again with the next turn."""
        name = self._served_name(model if isinstance(model, str) else None) if model else self._served_name(None)
        if name == chat.model:
            return
        _, backend = model_backend(name)
        old = chat.session.conversation
        conversation = Conversation.for_backend(backend, old.system, old.turns)
        conversation.pins, conversation.summary = old.pins, old.summary
        stop_tools(chat)
        chat.session.backend.close()
        chat.session.backend, chat.session.conversation, chat.tools_refused = backend, conversation, False
        chat.model = chat.saver.model = name
        chat.saver.kept(chat.session)

    def _idle(self, uid: str) -> LiveChat:
        chat = self.opened(uid)
        if chat.busy.locked():
            raise UsageError("this conversation is answering: stop it first")
        return chat

    def close(self) -> None:
        self._closing.set()
        self._starter.shutdown(wait=False, cancel_futures=True)
        for chat in list(self.live.values()):
            self._closed(chat)


def _unique(hits: list[Any]) -> list[Any]:
    seen, kept = set(), []
    for hit in hits:
        if hit.uid not in seen:
            seen.add(hit.uid)
            kept.append(hit)
    return kept
