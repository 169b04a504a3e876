"""What only the engine knows, counted as Prometheus figures (``prometheus_client``, a registry of
its own) and answered at its ``GET /metrics``: the front scrapes each engine it started and shows
them with the model's id on one scrape target (``serve.front.metrics``).

Counted per reply as it streams (``counted``): its prompt tokens, those served from a cache by tier
(memory, disk), its completion tokens, its time to the first token (from when the engine took the
request), the part of that spent in the batch queue, and the time between tokens; per prompt, where
it broke from its cache (by the message's role).
Read when scraped: the requests decoding together now, and what the KV caches hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from localchat.serve.engine.cache_breaks import Outcome

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class EngineFigures:
    def __init__(self, kv_bytes: Callable[[], int], batch_size: Callable[[], int],
                 largest_batch: Callable[[], int]) -> None:
        self.registry = registry = CollectorRegistry()
        self.prompt_tokens = Counter("localchat_prompt_tokens", "Prompt tokens of the requests answered.",
                                     registry=registry)
        self.cached_tokens = Counter("localchat_cached_prompt_tokens", "Prompt tokens served from a prompt "
                                     "cache instead of prefilled, by tier (memory, disk).", ["tier"], registry=registry)
        self.completion_tokens = Counter("localchat_completion_tokens", "Tokens generated.", registry=registry)
        self.ttft = Histogram("localchat_engine_time_to_first_token_seconds", "From the engine taking a "
                              "request to its first token (its prefill).", buckets=TTFT_BUCKETS, registry=registry)
        self.queued = Histogram("localchat_batch_queue_seconds", "From the engine taking a request to its joining "
                                "the batch (the generation loop's turn, its cached prefix found); part of the TTFT.",
                                buckets=TTFT_BUCKETS, registry=registry)
        self.itl = Histogram("localchat_inter_token_latency_seconds", "Between two tokens of one reply.",
                             buckets=ITL_BUCKETS, registry=registry)
        self.breaks = Counter("localchat_prompt_cache_breaks", "Prompts that parted from a cached prefix "
                              "before its end, by the role of the message where they parted.", ["role"],
                              registry=registry)
        Gauge("localchat_batch_size", "Requests decoding together now.", registry=registry).set_function(batch_size)
        Gauge("localchat_batch_size_max", "The most requests one batch has held since the engine started.",
              registry=registry).set_function(largest_batch)
        Gauge("localchat_kv_cache_bytes", "What the engine's KV caches hold now (the batch's and the prompt "
              "cache's).", registry=registry).set_function(kv_bytes)

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def prompt(self, prompt_tokens: int, outcome: Outcome | None) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        if outcome is not None and outcome.cached:
            self.cached_tokens.labels(tier=outcome.tier).inc(outcome.cached)
        if outcome is not None and outcome.broke is not None:
            self.breaks.labels(role=outcome.broke.role or "unknown").inc()

    def counted(self, reply: Iterator[Any], taken: float) -> Iterator[Any]:
        """``reply`` as it comes, its tokens and times counted (``taken``: when the engine took it)."""
        last = None
        for part in reply:
            now = time.perf_counter()
            if last is None:
                self.ttft.observe(now - taken)
            else:
                self.itl.observe(now - last)
            last = now
            self.completion_tokens.inc()
            yield part
