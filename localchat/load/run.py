"""``localchat load`` core: simulated users, each a thread playing multi-turn conversations.

Users are threads, each with its own ``ServerBackend`` (one pooled httpx client) and its own
``ChatSession`` per conversation: the same history builder, chunk decoder and clock as ``chat``.
Threads, not asyncio: the streaming code is synchronous and shared with ``chat``, and an async
copy of it would be a second decoder and clock; the client is measured against an instant server
(``scripts/bench_load_client.py``) so that it is never what limits a run.

A run is one concurrency and one history setting; a sweep is several. Every run is bounded: each
user plays ``conversations`` conversations, and no request starts after ``duration_s``. Seeds are
not sent unless asked for, so mlx_lm.server batches the users' requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localchat.backends import GenerationParams
from localchat.bench.script import BenchScript, PlannedTurn, plan
from localchat.conversation.compaction import CompactionPolicy
from localchat.conversation.history import Conversation
from localchat.conversation.settings import TrimPolicy
from localchat.conversation.turn import ChatSession
from localchat.load.metrics import RequestRecord, Slo, request_record

FILLER_TURN = PlannedTurn("Thanks!", None, None)


@dataclass(frozen=True)
class LoadPlan:
    """What every run plays: the same conversations (and drawn codes) for each setting."""

    script: BenchScript
    conversations: int  # per user
    turns: int | None  # None: the script's own number of turns
    think_time_s: float
    duration_s: float | None
    params: GenerationParams
    seed: int
    slo: Slo = field(default_factory=Slo)
    trim: TrimPolicy = field(default_factory=TrimPolicy)  # --max-context-tokens and --trim-to
    compact: bool = False  # --compact auto
    tools: Any = None  # tools.runner.ToolRunner, shared by every user (its process runs one call at a time)

    def turns_for(self, user: int, k: int) -> list[PlannedTurn]:
        """Conversation ``k`` of ``user``: drawn from (seed, user, k), so every run and history
        setting sees the same codes. ``turns`` cuts it short, or pads it before its last turn with
        the script's unscored turns (so a recall stays last and history has to carry it further)."""
        index = k % len(self.script.conversations)
        planned = plan(self.script, self.seed, user * self.conversations + k, index)
        if self.turns is None or self.turns == len(planned):
            return planned
        if self.turns < len(planned):
            return planned[:self.turns]
        fillers = [t for t in planned if not t.scored] or [FILLER_TURN]
        extra = [fillers[i % len(fillers)] for i in range(self.turns - len(planned))]
        return planned[:-1] + extra + planned[-1:]


@dataclass
class RunResult:
    users: int
    history: bool
    repeat: int = 0  # which pass of the sweep (--repeat)
    wall_s: float = 0.0
    records: list[RequestRecord] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    partial: bool = False


class Run:
    """One concurrency level with one history setting; ``stop`` ends it early (Ctrl+C)."""

    def __init__(self, plan: LoadPlan, users: int, history: bool, make_backend: Callable[[], Any],
                 on_request: Callable[[RequestRecord], None] = lambda _: None, repeat: int = 0):
        self.plan, self.users, self.history = plan, users, history
        self.make_backend, self.on_request = make_backend, on_request
        self.result = RunResult(users, history, repeat)
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._backends: list[Any] = []
        self._started = 0.0

    def execute(self) -> RunResult:
        """Start every user, wait for all; Ctrl+C stops them and the result is marked partial."""
        self._started = time.perf_counter()
        threads = [threading.Thread(target=self._user, args=(u,), daemon=True, name=f"user-{u}")
                   for u in range(self.users)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.1)
        except KeyboardInterrupt:
            self.stop()
            for thread in threads:
                thread.join(5.0)
            raise
        finally:
            self.result.wall_s = time.perf_counter() - self._started
        return self.result

    def stop(self) -> None:
        """No new request starts; requests in flight are cut (their clients closed)."""
        self.stopped.set()
        self.result.partial = True
        with self._lock:
            for backend in self._backends:
                backend.close()

    def _past_deadline(self) -> bool:
        limit = self.plan.duration_s
        return limit is not None and time.perf_counter() - self._started >= limit

    def _user(self, user: int) -> None:
        backend = self.make_backend()
        with self._lock:
            self._backends.append(backend)
        try:
            for k in range(self.plan.conversations):
                if not self._play(backend, user, k):
                    return
        finally:
            backend.close()

    def _play(self, backend: Any, user: int, k: int) -> bool:
        """One conversation; False once the run must end."""
        session = ChatSession(backend, Conversation.for_backend(backend, self.plan.script.system), self.plan.params,
                              use_history=self.history, trim=self.plan.trim,
                              compaction=CompactionPolicy(auto=True) if self.plan.compact else None,
                              tools=self.plan.tools).prepare()
        for i, turn in enumerate(self.plan.turns_for(user, k), 1):
            if self.stopped.is_set() or self._past_deadline():
                return False
            started = time.perf_counter() - self._started
            result = session.ask(turn.user)
            self._keep(request_record(
                result, users=self.users, history=self.history, user=user, conversation=k, turn=i,
                started_s=started, scored=turn.scored, correct=turn.is_correct(result.text) if turn.scored else None,
                stopped=self.stopped.is_set()), result.token_gaps_s)
            if self.plan.think_time_s and self.stopped.wait(self.plan.think_time_s):
                return False
        return True

    def _keep(self, record: RequestRecord, gaps: tuple[float, ...]) -> None:
        with self._lock:
            self.result.records.append(record)
            self.result.gaps.extend(gaps)
        self.on_request(record)
