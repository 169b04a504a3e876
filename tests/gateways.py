"""A gateway for a test: in front of a real mlx_lm.server (or a fake one), on a free loopback port,
its log lines kept, stopped after."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from localchat.registry import resolve
from localchat.serve.front.running import RunningGateway, serve_gateway, start_gateway
from localchat.serve.pool.entries import upstream_pool
from localchat.serve.pool.upstream import Upstream, reach_upstream
from localchat.server.launch import free_port


@dataclass
class TestGateway:
    running: RunningGateway
    upstream: Upstream
    logs: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.running.url

    def post(self, path: str, **kwargs) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def get(self, path: str, **kwargs) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def options(self, path: str, **kwargs) -> httpx.Response:
        return self.request("OPTIONS", path, **kwargs)

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """A request to the gateway; one that finds nothing listening fails the test saying so."""
        import pytest

        try:
            return httpx.request(method, self.url + path, timeout=60.0, **kwargs)
        except httpx.ConnectError as exc:
            pytest.fail(f"the gateway is not running: nothing listens at {self.url} ({exc}); its log: {self.logs}")


@contextmanager
def gateway_for(base_url: str, model: str | None = None, *, api_key: str | None = None, ready: bool = True,
                **upstream_fields) -> Iterator[TestGateway]:
    """The gateway in front of ``base_url``; ``ready`` waits for a 1-token request through it (a
    real server), otherwise it only listens (a fake server scripted by the test)."""
    logs: list[str] = []
    ref = resolve(model) if model else None
    if ready:
        upstream = reach_upstream(base_url, ref)
        for name, value in upstream_fields.items():
            setattr(upstream, name, value)
        running = serve_gateway(upstream_pool(upstream), "127.0.0.1", free_port(), ("anthropic", "responses"), api_key,
                                logs.append, model=upstream.model_field)
    else:
        from localchat.serve.front.app import Gateway

        upstream = Upstream(base_url=base_url, model_field="default_model", model_id="fake", **upstream_fields)
        running = start_gateway(
            Gateway(upstream_pool(upstream), api_key=api_key, log=logs.append), "127.0.0.1", free_port()
        )
    try:
        yield TestGateway(running, upstream, logs)
    finally:
        running.stop()
