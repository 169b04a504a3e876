"""The server's side of a load run: when the server answers ``/metrics`` (``localchat serve`` does),
it is read before and after the run and the difference is shown beside the client's figures:
requests it counted, time waited for a model to load, the largest batch, the cached share of the
prompt tokens by tier, and the loads and unloads during the run. A server without ``/metrics``
(plain mlx_lm.server, another runtime) shows nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from localchat.backends.http import shared_ssl_context

SCRAPE_S = 10.0


@dataclass(frozen=True)
class Scrape:
    """One read of ``/metrics``: each sample's value summed over its labels but the ones kept."""

    values: dict[tuple[str, str], float]  # (sample name, the value of its kept label or "") → value

    def get(self, name: str, label: str = "") -> float:
        return self.values.get((name, label), 0.0)

    def has(self, name: str) -> bool:
        return any(sample == name for sample, _ in self.values)


KEPT_LABELS = ("tier", "reason", "waited_for")


def scrape(base_url: str, api_key: str | None = None) -> Scrape | None:
    """``/metrics`` of the server at ``base_url`` (its ``/v1`` or root), or None when it has none."""
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(root + "/metrics", headers=headers, timeout=SCRAPE_S, verify=shared_ssl_context())
        if response.status_code != 200 or not response.headers.get("content-type", "").startswith("text/plain"):
            return None
        families = list(text_string_to_metric_families(response.text))
    except (httpx.HTTPError, ValueError):
        return None
    values: dict[tuple[str, str], float] = {}
    for family in families:
        for sample in family.samples:
            kept = next((sample.labels[k] for k in KEPT_LABELS if k in sample.labels), "")
            key = (sample.name, kept)
            if sample.name.endswith("_created"):
                continue
            if family.type == "gauge" and sample.name == "localchat_batch_size_max":
                values[key] = max(values.get(key, 0.0), sample.value)
            else:
                values[key] = values.get(key, 0.0) + sample.value
    return Scrape(values=values)


def server_side_lines(before: Scrape | None, after: Scrape | None) -> list[str]:
    """The run as the server saw it; nothing when it has no ``/metrics``."""
    if before is None or after is None:
        return []

    def grew(name: str, label: str = "") -> float:
        return after.get(name, label) - before.get(name, label)

    prompt = grew("localchat_prompt_tokens_total")
    memory, disk = grew("localchat_cached_prompt_tokens_total", "memory"), grew("localchat_cached_prompt_tokens_total",
                                                                              "disk")
    loads = grew("localchat_model_loads_total")
    unloads = sum(grew("localchat_model_unloads_total", r) for r in ("idle", "made room", "crashed", "stopped"))
    shares = (f"{memory / prompt:.0%} from memory, {disk / prompt:.0%} from disk" if prompt
              else "no prompt tokens")
    counted = (f"{grew('localchat_requests_total'):.0f} requests" if after.has("localchat_requests_total") else
               f"{grew('localchat_engine_time_to_first_token_seconds_count'):.0f} replies (an engine without serve's "
               "front)")
    lines = [f"server side (its /metrics): {counted}, {prompt:,.0f} prompt tokens ({shares}), "
             f"{grew('localchat_completion_tokens_total'):,.0f} completion tokens",
             f"  the largest batch so far: {after.get('localchat_batch_size_max'):.0f} requests; "
             + "; ".join(_waited(grew)) + f"; {loads:.0f} loads and {unloads:.0f} unloads during the run"]
    breaks = grew("localchat_prompt_cache_breaks_total")
    if breaks:
        lines.append(f"  {breaks:.0f} prompts broke from their cache before its end (see the engine's log)")
    return lines


def _waited(grew) -> list[str]:
    """What the requests waited for, in order: room, a load (at the front), the batch queue (the engine)."""
    said = []
    for label, what in (("room", "for room"), ("load", "for a load")):
        count, total = grew("localchat_wait_seconds_count", label), grew("localchat_wait_seconds_sum", label)
        said.append(f"{count:.0f} requests waited {total / count:.2f}s on average {what}" if count else
                    f"no request waited {what}")
    count, total = grew("localchat_batch_queue_seconds_count"), grew("localchat_batch_queue_seconds_sum")
    if count:
        said.append(f"{total / count * 1e3:.0f} ms on average in the batch queue")
    return said
