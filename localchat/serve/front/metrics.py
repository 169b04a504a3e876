"""``GET /metrics``: serve seen from Prometheus, one scrape target for the front and every engine
(``prometheus_client``'s text format; a registry of this serve's own, no global one).

- **The front counts** what passes through it: requests by model, API and status, their end-to-end
  time, the time a request waited for room and for its model to load; the pool's loads, unloads by reason
  (``idle``, ``made room``, ``crashed``, ``stopped``) and admission refusals.
- **Read when scraped**: each model's requests in flight, its estimated and resident memory, the
  prompt caches on disk (bytes, files); and each loaded engine's own figures (``engine.figures``:
  prompt, cached and completion tokens, TTFT, inter-token latency, batch size, KV cache bytes, cache
  breaks by role), fetched from the engine and labelled with the model's id.

Names and units follow Prometheus's conventions (``_total``, ``_seconds``, ``_bytes``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from localchat.backends.http import shared_ssl_context

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
API_OF_PATH = {"/v1/chat/completions": "chat_completions", "/v1/completions": "completions",
               "/v1/messages": "messages", "/v1/responses": "responses"}  # the requests counted
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
WAIT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
ENGINE_SCRAPE_S = 2.0


class ServeMetrics:
    """The figures of one ``serve``; ``status`` is the pool's (``ModelPool.status``), read when scraped."""

    def __init__(self, status: Callable[[], dict[str, Any]] = dict) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("localchat_requests", "Requests answered, by model, API and HTTP status.",
                                ["model", "api", "status"], registry=registry)
        self.duration = Histogram("localchat_request_duration_seconds", "A request's end-to-end time at the front.",
                                  ["model", "api"], buckets=DURATION_BUCKETS, registry=registry)
        self.waits = Histogram("localchat_wait_seconds", "Time a request waited before its model could take it, "
                               "by what it waited for.", ["model", "waited_for"], buckets=WAIT_BUCKETS,
                               registry=registry)
        self.loads = Counter("localchat_model_loads", "Models loaded.", ["model"], registry=registry)
        self.unloads = Counter("localchat_model_unloads", "Models unloaded, by reason.", ["model", "reason"],
                               registry=registry)
        self.refusals = Counter("localchat_admission_refusals", "Requests refused because their model could "
                                "not be admitted within the memory budget.", ["model"], registry=registry)
        registry.register(_Scraped(status))

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def request_ended(self, model: str, api: str, status: int, seconds: float,
                      waits: dict[str, float | None] | None = None) -> None:
        """One request answered; ``waits``: what it waited for before its model took it (``load``,
        ``room``), in seconds (the engine counts its own batch queue)."""
        model = model or "(none)"
        self.requests.labels(model=model, api=api, status=str(status)).inc()
        self.duration.labels(model=model, api=api).observe(seconds)
        for waited_for, waited in (waits or {}).items():
            if waited is not None:
                self.waits.labels(model=model, waited_for=waited_for).observe(waited)

    # --- what the pool says happened (``pool.events``) ------------------------------------------------

    def loaded(self, model: str) -> None:
        self.loads.labels(model=model).inc()

    def unloaded(self, model: str, reason: str) -> None:
        self.unloads.labels(model=model, reason=reason).inc()

    def refused(self, model: str) -> None:
        self.refusals.labels(model=model).inc()


class _Scraped:
    """The pool's gauges and the engines' own figures, read at each scrape."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def describe(self) -> list[Metric]:
        return []  # (read when scraped: nothing to check when registered)

    def collect(self) -> Iterator[Metric]:
        held = self.status()
        rows = [r for r in held.get("models", []) if isinstance(r, dict)]
        for name, text, value in (("localchat_requests_in_flight", "Requests being answered now.", "in_flight"),
                                  ("localchat_model_estimated_bytes", "What admission counts for the model.",
                                   "memory_bytes"),
                                  ("localchat_model_resident_bytes", "The engine's resident memory.",
                                   "resident_bytes")):
            gauge = GaugeMetricFamily(name, text, labels=["model"])
            for row in rows:
                if isinstance(row.get(value), int):
                    gauge.add_metric([row["model"]], row[value])
            yield gauge
        disk = held.get("prompt_cache")
        if isinstance(disk, dict):
            yield GaugeMetricFamily("localchat_prompt_cache_disk_bytes", "The prompt caches on disk.",
                                    value=disk.get("bytes", 0))
            yield GaugeMetricFamily("localchat_prompt_cache_disk_files", "Files of the prompt caches on disk.",
                                    value=disk.get("files", 0))
        yield from engines_figures(rows)


def engines_figures(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    """Each loaded engine's ``/metrics``, its samples labelled with the model's id, one family a name."""
    families: dict[str, Metric] = {}
    for row in rows:
        if row.get("state") != "loaded" or not isinstance(row.get("engine_url"), str):
            continue
        try:
            text = httpx.get(row["engine_url"].removesuffix("/v1") + "/metrics", timeout=ENGINE_SCRAPE_S,
                             verify=shared_ssl_context()).text
            parsed = list(text_string_to_metric_families(text))
        except (httpx.HTTPError, ValueError):
            continue  # an engine that does not answer (``--plain``, a picture model's): its figures are absent
        for family in parsed:
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for sample in family.samples:
                merged.add_sample(sample.name, {**sample.labels, "model": row["model"]}, sample.value)
    yield from families.values()


def leased(request: Any, lease: Any) -> Any:
    """``lease``, its model and load wait noted on the request for ``counted``."""
    request.state.model = lease.upstream.model_id
    request.state.waits = {"load": lease.loaded_s, "room": lease.room_s}
    return lease


def counted(app: Callable[..., Awaitable[None]], metrics: ServeMetrics) -> Callable[..., Awaitable[None]]:
    """``app`` with each API request counted when its response has been sent whole (a stream too)."""

    async def counting(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        api = API_OF_PATH.get(scope.get("path", "")) if scope["type"] == "http" else None
        if api is None:
            return await app(scope, receive, send)
        started, status = time.perf_counter(), [500]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await app(scope, receive, sending)
        finally:
            state = scope.get("state") or {}
            metrics.request_ended(state.get("model", ""), api, status[0], time.perf_counter() - started,
                                  state.get("waits"))

    return counting
