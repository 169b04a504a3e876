"""Keeping a conversation as it happens: after every accepted turn (and every change to what it
holds), its state is written and its new turns are logged, in one transaction (``SessionStore.save``).
``/save NAME`` gives it a name and writes its KV cache; leaving writes the KV cache too, so that
``chat --continue`` prefills only what is new. A write that fails (a full disk, a read-only or
locked database) never stops the chat: it is said once, and the next turns try again. With
``--no-log`` (or ``log: false`` in config.yaml) only ``/save`` writes, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from localchat.conversation.history import Turn
from localchat.conversation.turn import ChatSession
from localchat.errors import LocalchatError
from localchat.store.saved_sessions import ContinuedElsewhere, SavedSession, SessionStore, validate_name
from localchat.store.session_cache import CacheWrite, SessionCaches, write_cache

CONTINUED_ELSEWHERE = ("this conversation was continued elsewhere since it was opened here: this turn was not kept; "
                       "open it again to go on from its latest turn")


@dataclass(frozen=True)
class Saved:
    name: str
    replaced: bool  # an earlier save of this conversation under the name
    cache: CacheWrite | None  # None: this backend keeps no cache, or --no-save-cache


@dataclass
class SessionSaver:
    """Where and as what the live session is kept: the store, its identity, its name (once saved)."""

    store: SessionStore
    uid: str
    model: str | None
    name: str | None = None  # the last name saved (or resumed) under; /save without NAME reuses it
    caches: SessionCaches | None = None
    saved_state: tuple | None = None  # ``saved_state(...)`` at the last write (or the resume)
    logging: bool = False  # every accepted turn kept as it commits (--no-log: False)
    revision: int = 0  # the stored state's revision this one is built on (a resumed conversation's, or 0)
    stale: bool = False  # a write was refused: the stored state moved on (another page or terminal)
    _logged: dict[int, Turn] = field(default_factory=dict, repr=False)  # the turns already logged, by identity
    _failing: bool = field(default=False, repr=False)
    _refused: int = field(default=0, repr=False)  # the turns held when a write was last refused (stale)

    def start(self, session: ChatSession) -> None:
        """What the session holds when it begins (a resumed conversation's turns) is logged already,
        and kept as it is."""
        self._remember_logged(session.conversation.turns)
        if self.saved_state is None:
            self.saved_state = saved_state(self._snapshot(session, self.name))

    @property
    def key(self) -> str:
        """The name its KV cache is kept under."""
        return self.name or f"chat-{self.uid}"

    def kept(self, session: ChatSession, taken_back: int = 0) -> str | None:
        """Write the state and log the turns accepted since the last write; ``taken_back`` of the
        logged ones were undone or replaced. The line to say, once, when this cannot be kept."""
        if not self.logging:
            return None
        new = self._new_turns(session.conversation.turns)
        if self.stale:  # continued elsewhere: nothing more is written from here; each new turn is said once
            said, self._refused = self._refused, len(session.conversation.turns)
            return CONTINUED_ELSEWHERE if len(session.conversation.turns) > said else None
        snapshot = self._snapshot(session, self.name)
        state = saved_state(snapshot)
        if not new and not taken_back and state == self.saved_state:
            return None
        if not new and not taken_back and not self._logged and self.name is None:
            return None  # nothing was ever accepted: there is no conversation to keep yet
        try:
            written = self.store.save(snapshot, log=new, take_back=taken_back, based_on=self.revision)
        except ContinuedElsewhere as exc:
            self.stale, self._refused = True, len(session.conversation.turns)
            return str(exc)
        except LocalchatError as exc:
            said, self._failing = self._failing, True
            return None if said else f"this conversation is not being kept ({exc}); the chat goes on"
        self.saved_state, self._failing, self.revision = state, False, written.revision
        self._remember_logged(session.conversation.turns)
        return None

    def _new_turns(self, turns: Sequence[Turn]) -> tuple[Turn, ...]:
        """The turns not logged yet, found by identity: trimming drops the oldest, a compaction
        replaces them by notes, ``/undo`` takes the last back and ``/retry`` puts a new one there."""
        return tuple(turn for turn in turns if id(turn) not in self._logged)

    def _remember_logged(self, turns: Sequence[Turn]) -> None:
        """Every turn the history holds now is logged (held here, so no id is reused while it counts)."""
        if turns:
            self._logged = {id(turn): turn for turn in turns}

    def save(self, session: ChatSession, name: str | None = None) -> Saved:
        """Save the accepted turns under a name (the new one, or the last one, or ``chat-UID``),
        then the KV cache beside them."""
        name = validate_name(name) if name else (self.name or f"chat-{self.uid}")
        new = self._new_turns(session.conversation.turns) if self.logging else ()
        written = self.store.save(self._snapshot(session, name), log=new, based_on=self.revision)
        replaced, self.name, self.revision = written.replaced, name, written.revision
        self.saved_state = saved_state(self._snapshot(session, name))
        self._remember_logged(session.conversation.turns)
        cache = write_cache(session, self.uid, name, self.caches) if self.caches else None
        return Saved(name=name, replaced=replaced, cache=cache)

    def leave(self, session: ChatSession) -> CacheWrite | None:
        """On leaving a kept conversation: its last state, and its KV cache for ``--continue``; no
        cache for a conversation that was never kept (no accepted turn, no name), which nothing
        would own or ever read."""
        self.kept(session)
        owned = bool(self._logged) or self.name is not None
        return write_cache(session, self.uid, self.key, self.caches) if self.caches and owned and not self._failing \
            else None

    def unsaved(self, session: ChatSession) -> bool:
        """Turns, pins, notes or settings not written yet (never, while every turn is kept)."""
        return self.saved_state != saved_state(self._snapshot(session, self.name))

    def _snapshot(self, session: ChatSession, name: str | None) -> SavedSession:
        conversation = session.conversation
        return SavedSession(name=name, uid=self.uid, model=self.model, backend=session.backend.name,
                            system=conversation.system, params=_params(session), turns=tuple(conversation.turns),
                            pins=tuple(conversation.pins), summary=_notes(session))


def _params(session: ChatSession) -> dict:
    """The generation settings as a saved session keeps them (an answer format by its description)."""
    params = asdict(session.params)
    if session.params.answer is not None:
        params["answer"] = session.params.answer.described()
    return params


def _notes(session: ChatSession) -> str | None:
    summary = session.conversation.summary
    return summary.text if summary else None


def saved_state(saved: SavedSession) -> tuple:
    """What a save keeps of a conversation, comparable: a changed system message or setting is
    written as a new turn is (``/set system``, the page's Set), not lost when it is left."""
    return tuple(saved.turns), tuple(saved.pins), saved.summary, saved.system, saved.params
