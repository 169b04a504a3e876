"""The models one port serves, each in an engine child of its own while loaded: a request leases
its model (loading it first, once, however many requests race for it), admission holds the
estimates against the budget first, and a reaper unloads what has been idle past its keep-alive.

Children are started from one long-lived loader thread: on Linux a child's parent-death signal
fires when the *thread* that started it ends, and a request's worker thread ends when idle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from localchat.errors import LocalchatError, UsageError
from localchat.fit.budget import MemoryBudget
from localchat.serve.pool.admission import Resident, admit
from localchat.serve.pool.keep_alive import parse_keep_alive, shown
from localchat.serve.pool.lease import Lease
from localchat.serve.pool.rows import engine_kv, held_row
from localchat.serve.pool.served import LOADED, LOADING, UNLOADED, UNLOADING, ServedModel
from localchat.serve.pool.upstream import SERVER_DEFAULT_MODEL, Upstream
from localchat.serve.request import MISSING, ApiError, invalid
from localchat.sizes import shown_size
from localchat.store.prompt_files import PromptFiles

REAP_S = 0.25  # how often idle and ended children are looked for
ADMISSION_WAIT_S = 60.0  # how long a load waits for busy models to go idle before its 503
WAIT_STEP_S = 0.1
NOTICED_WAIT_S = 0.05  # a shorter wait (the lock, a check) is not counted as waiting

Launcher = Callable[[ServedModel], tuple[Any, Upstream]]  # (RunningServer, its Upstream)


def not_found_body(model_id: str, ids: list[str]) -> dict[str, Any]:
    """A model this port does not serve, in OpenAI's error shape (which Anthropic's SDK reads too)."""
    shown = model_id if len(model_id) <= 80 else model_id[:80] + "…"
    message = f"no model {shown!r} here: this server serves {', '.join(ids)}"
    return {"error": {"message": message, "type": "not_found_error", "param": "model", "code": "model_not_found"},
            "type": "error"}


class NotServed(ApiError):
    def __init__(self, name: str, ids: list[str]):
        super().__init__(404, "not_found_error", not_found_body(name, ids)["error"]["message"], "model")


class PoolEvents(Protocol):
    """What the pool tells ``/metrics`` (``front.metrics.ServeMetrics``) as it happens."""

    def loaded(self, model: str) -> None: ...

    def unloaded(self, model: str, reason: str) -> None: ...

    def refused(self, model: str) -> None: ...


class _Untold:
    def loaded(self, model: str) -> None:
        pass

    def unloaded(self, model: str, reason: str) -> None:
        pass

    def refused(self, model: str) -> None:
        pass


@dataclass
class ModelPool:
    models: list[ServedModel]
    launcher: Launcher
    budget: MemoryBudget | None = None
    keep_alive: float | None = 300.0  # --keep-alive
    force: bool = False
    log: Callable[[str], None] = lambda _: None
    prompt_files: PromptFiles | None = None  # the disk tier of prompt caches, when serve keeps one
    events: PoolEvents = field(default_factory=_Untold)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _loader: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "engine-loader"))
    _closing: threading.Event = field(default_factory=threading.Event)

    # --- what requests see ---------------------------------------------------------------------

    def find(self, name: str) -> ServedModel | None:
        if name in ("", SERVER_DEFAULT_MODEL):
            return self.models[0]
        exact = next((m for m in self.models if name in m.names), None)
        if exact is not None or len(self.models) > 1:
            return exact
        return self.models[0]  # one model takes any name (clients name models of their own)

    def loaded(self, name: str) -> bool:
        """Whether the model ``name`` is ready now (a request for it then waits for no load)."""
        model = self.find(name)
        return model is not None and (model.remote is not None or model.state == LOADED)

    def model_ids(self) -> list[str]:
        return [name for m in self.models for name in (m.listed or (m.key,))]

    def health_upstream(self) -> Upstream | None:
        """The server whose ``/health`` this port relays: the one upstream of a pool of one remote
        entry (``gateway --upstream``); else None (the front answers, whatever is loaded)."""
        return self.models[0].remote if len(self.models) == 1 else None

    def lease(self, name: str, keep_alive: Any = MISSING) -> Lease:
        """The model ``name`` loaded and counted in flight until the lease is released; a 404 for
        a name not served, a 503 for a model that cannot have the memory it needs."""
        model = self.find(name) if isinstance(name, str) else None
        if model is None:
            raise NotServed(str(name), self.model_ids())
        kept = self._keep_alive_of(keep_alive)
        if model.remote is not None:
            with self._changed:
                model.in_flight += 1
            return Lease(upstream=model.remote, on_release=lambda: self._release(model, kept))
        room_s, loaded_s = self._loaded_or_load(model)
        assert model.upstream is not None  # (a loaded model has its engine's upstream)
        return Lease(upstream=model.upstream, loaded_s=loaded_s, room_s=room_s,
                     on_release=lambda: self._release(model, kept))

    def _keep_alive_of(self, value: Any) -> float | None:
        if value is MISSING or value is None:
            return self.keep_alive
        try:
            return parse_keep_alive(value)
        except UsageError as exc:
            raise invalid(str(exc), "keep_alive") from None

    def _release(self, model: ServedModel, keep_alive: float | None) -> None:
        with self._changed:
            model.in_flight = max(0, model.in_flight - 1)
            model.last_used = time.monotonic()
            model.keep_alive = keep_alive
            self._changed.notify_all()

    # --- loading, admitted ----------------------------------------------------------------------

    def _loaded_or_load(self, model: ServedModel) -> tuple[float | None, float | None]:
        """Counts ``model`` in flight, loading it first when it is not. Returns how long this request
        waited for room (busy models to finish, others to unload) and for a load (its own, or one
        another request started), each None when it did not wait for it."""
        deadline, started = time.monotonic() + ADMISSION_WAIT_S, time.perf_counter()
        with self._changed:
            model.waiting += 1  # (``ps`` shows the requests waiting for a load or for room)
        try:
            with self._changed:
                victims = self._next_step(model, deadline)
                if victims is None:
                    model.in_flight += 1
                    waited = time.perf_counter() - started
                    return None, (waited if waited >= NOTICED_WAIT_S else None)
            self._unload_all(victims)
            room_at = time.perf_counter()
            self._load(model)
            room_s = room_at - started
            return (room_s if victims or room_s >= NOTICED_WAIT_S else None), time.perf_counter() - room_at
        finally:
            with self._changed:
                model.waiting -= 1

    def _next_step(self, model: ServedModel, deadline: float) -> list[ServedModel] | None:
        """Under the lock: None when ``model`` can be used now; else the models to unload before it
        loads (``model`` is then marked loading). Waits while it cannot tell."""
        while True:
            if model.child_ended:
                self._forget_ended(model)
            waiting_on_drain = model.state == LOADED and time.monotonic() < model.drain_until
            if model.state == LOADED and not waiting_on_drain:
                return None
            if model.state == UNLOADED:
                plan = admit(model.estimate, self._residents(), self.budget.bytes if self.budget else None,
                             self.force)
                if plan.refused is not None:
                    raise self._refusal(model, plan.refused)
                if not plan.wait_for:
                    victims = [self._named(key) for key in plan.unload]
                    for victim in victims:
                        victim.state = UNLOADING
                    model.state = LOADING
                    return victims
                if time.monotonic() > deadline:
                    raise self._busy(model, plan.wait_for)
                for key in plan.wait_for:
                    self._named(key).drain_until = max(self._named(key).drain_until, deadline)
            elif time.monotonic() > deadline and model.state != LOADING:
                raise self._busy(model, ())
            self._changed.wait(WAIT_STEP_S)

    def _load(self, model: ServedModel) -> None:
        """Start ``model``'s child (in the loader thread) and count this request in flight. A load
        that fails is a 503 with the child's own line."""
        started = time.perf_counter()
        try:
            server, upstream = self._loader.submit(self.launcher, model).result()
            if self._closing.is_set():
                server.stop()
                raise LocalchatError("serve is stopping")
        except (LocalchatError, OSError, RuntimeError) as exc:  # (RuntimeError: the loader was shut down)
            with self._changed:
                model.state = UNLOADED
                self._changed.notify_all()
            self.log(f"{model.key} failed to load: {exc}")  # (serve's own output names the engine's log)
            raise ApiError(503, "api_error", f"{model.key} failed to load: {getattr(exc, 'reason', exc)}") from None
        with self._changed:
            model.server, model.upstream, model.state = server, upstream, LOADED
            model.loaded_at, model.loads, model.in_flight = time.time(), model.loads + 1, model.in_flight + 1
            model.last_used, model.drain_until = time.monotonic(), 0.0
            self._changed.notify_all()
        self.events.loaded(model.key)
        self.log(f"loaded {model.key} in {time.perf_counter() - started:.1f}s (pid {server.process.pid}, "
                 f"estimate {shown_size(model.estimate)}{self._budget_words()})")

    def load_at_start(self, model: ServedModel, server: Any, upstream: Upstream) -> None:
        """The model ``serve`` loaded before its port opened (its fit checked as ``chat``'s is)."""
        with self._changed:
            model.server, model.upstream, model.state = server, upstream, LOADED
            model.loaded_at, model.loads, model.last_used = time.time(), 1, time.monotonic()
            model.keep_alive = self.keep_alive
        self.events.loaded(model.key)

    def _residents(self) -> list[Resident]:
        return [Resident(key=m.key, bytes=m.estimate, busy=m.busy, last_used=m.last_used, pinned=m.pinned)
                for m in self.models if m.holds_memory]

    def _named(self, key: str) -> ServedModel:
        return next(m for m in self.models if m.key == key)

    def _budget_words(self) -> str:
        held = sum(m.estimate for m in self.models if m.holds_memory)
        return f"; {shown_size(held)} of {shown_size(self.budget.bytes)} held" if self.budget else ""

    def _refusal(self, model: ServedModel, why: str) -> ApiError:
        self.events.refused(model.key)
        budget = f"{self.budget.source} is {shown_size(self.budget.bytes)}" if self.budget else "no budget"
        if why == "alone":
            text = (f"{model.key} needs ~{shown_size(model.estimate)} and {budget}: it cannot load here "
                    "(serve --force to try)")
        else:
            pinned = ", ".join(m.key for m in self.models if m.pinned and m.holds_memory)
            text = (f"{model.key} needs ~{shown_size(model.estimate)}; {budget} and the pinned models ({pinned}) "
                    "hold the rest")
        return ApiError(503, "overloaded_error", text, "model")

    def _busy(self, model: ServedModel, busy: tuple[str, ...]) -> ApiError:
        who = ", ".join(busy) or "the models in use"
        return ApiError(503, "overloaded_error", f"{model.key} needs ~{shown_size(model.estimate)}; {who} still "
                                                 "answering "
                                                 f"after {ADMISSION_WAIT_S:.0f}s: try again shortly", "model")

    # --- unloading --------------------------------------------------------------------------------

    def _unload_all(self, victims: list[ServedModel]) -> None:
        for victim in victims:
            self._unload(victim, "to make room", "made room")

    def _unload(self, model: ServedModel, why: str, reason: str) -> None:
        """Stop ``model``'s child (already marked unloading): its memory comes back whole."""
        server = model.server
        if server is not None:
            server.stop()
        with self._changed:
            model.server, model.upstream, model.state, model.drain_until = None, None, UNLOADED, 0.0
            model.loaded_at = None
            self._changed.notify_all()
        self.events.unloaded(model.key, reason)
        self.log(f"unloaded {model.key} {why}")

    def _forget_ended(self, model: ServedModel) -> None:
        """Under the lock: a child that ended by itself (a crash, a kill) is unloaded; the next
        request loads it again."""
        code = model.server.process.returncode if model.server is not None else None
        log_path = model.server.log_path if model.server is not None else "?"
        model.server, model.upstream, model.state, model.loaded_at = None, None, UNLOADED, None
        self.events.unloaded(model.key, "crashed")
        self.log(f"{model.key}'s engine ended by itself (exit code {code}); the next request loads it again "
                 f"(log: {log_path})")

    def reap(self) -> None:
        """One look: children that ended are forgotten; idle ones past their keep-alive unloaded."""
        now, due = time.monotonic(), []
        with self._changed:
            for model in self.models:
                if model.child_ended:
                    self._forget_ended(model)
                    self._changed.notify_all()
                elif self._expired(model, now):
                    model.state = UNLOADING
                    due.append(model)
        for model in due:
            self._unload(model, f"after {now - model.last_used:.0f}s idle (keep-alive {shown(model.keep_alive)})",
                         "idle")

    def _expired(self, model: ServedModel, now: float) -> bool:
        return (model.state == LOADED and not model.pinned and model.in_flight == 0 and model.remote is None
                and model.keep_alive is not None and now - model.last_used >= model.keep_alive)

    def run_reaper(self) -> threading.Thread:
        def loop() -> None:
            while not self._closing.wait(REAP_S):
                self.reap()

        thread = threading.Thread(target=loop, name="router-reaper", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Every child stopped (each returns once its whole process group has gone)."""
        self._closing.set()
        self._loader.shutdown(wait=False, cancel_futures=True)
        with self._changed:
            held = [m for m in self.models if m.server is not None]
            for model in held:
                model.state = UNLOADING
        threads = [threading.Thread(target=self._unload, args=(m, "(serve stopped)", "stopped")) for m in held]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    # --- what ps shows ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        from localchat.processes import resident_bytes

        now = time.monotonic()
        with self._changed:
            held = [m for m in self.models if m.holds_memory]
            rows = [held_row(m, now) for m in held]
        for row in rows:
            row["resident_bytes"] = resident_bytes(row["pid"]) if row["pid"] else None
            said = engine_kv(row["engine_url"]) if row["state"] == LOADED else {}
            row.update({"kv_bytes": None, "last_break": None} | said)
        files = self.prompt_files
        disk = {"dir": str(files.root), "bytes": files.total_bytes(), "files": files.file_count(),
                "max_bytes": files.max_bytes, "hits": files.hits()} if files is not None else None
        upstreams = {m.key: m.remote.base_url for m in self.models if m.remote is not None}
        return {"models": rows, "served": self.model_ids(), "prompt_cache": disk, "upstreams": upstreams,
                "budget_bytes": self.budget.bytes if self.budget else None,
                "budget_source": self.budget.source if self.budget else None}
