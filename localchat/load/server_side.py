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

SCRAPE_S = 10.0


@dataclass(frozen=True)
class Scrape:
    """One read of ``/metrics``: each sample's value summed over its labels but the ones kept."""

    values: dict[tuple[str, str], float]  # (sample name, the value of its kept label or "") → value

    def get(self, name: str, label: str = "") -> float:
        return self.values.get((name, label), 0.0)


KEPT_LABELS = ("tier", "reason", "waited_for")


def scrape(base_url: str, api_key: str | None = None) -> Scrape | None:
    """``/metrics`` of the server at ``base_url`` (its ``/v1`` or root), or None when it has none."""
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(root + "/metrics", headers=headers, timeout=SCRAPE_S)
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

    requests, prompt = grew("localchat_requests_total"), grew("localchat_prompt_tokens_total")
    memory, disk = grew("localchat_cached_prompt_tokens_total", "memory"), grew("localchat_cached_prompt_tokens_total",
                                                                              "disk")
    waits, waited = grew("localchat_wait_seconds_count", "load"), grew("localchat_wait_seconds_sum", "load")
    loads = grew("localchat_model_loads_total")
    unloads = sum(grew("localchat_model_unloads_total", r) for r in ("idle", "made room", "crashed", "stopped"))
    shares = (f"{memory / prompt:.0%} from memory, {disk / prompt:.0%} from disk" if prompt
              else "no prompt tokens")
    lines = [f"server side (its /metrics): {requests:.0f} requests, {prompt:,.0f} prompt tokens ({shares}), "
             f"{grew('localchat_completion_tokens_total'):,.0f} completion tokens",
             f"  the largest batch so far: {after.get('localchat_batch_size_max'):.0f} requests; "
             + (f"{waits:.0f} requests waited {waited / waits:.2f}s on average for a load; " if waits else
                "no request waited for a load; ")
             + f"{loads:.0f} loads and {unloads:.0f} unloads during the run"]
    breaks = grew("localchat_prompt_cache_breaks_total")
    if breaks:
        lines.append(f"  {breaks:.0f} prompts broke from their cache before its end (see the engine's log)")
    return lines
