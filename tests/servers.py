"""A real mlx_lm.server for a test module: launched on a free loopback port, stopped after."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from localchat.registry import resolve
from localchat.server.launch import free_port, launch, wait_ready


@contextmanager
def serving(model: str | Path, log_dir: Path, extra_args: tuple[str, ...] = ()) -> Iterator:
    """The registry's ``model`` (or a model directory) served until the block ends; the server is
    stopped even on failure."""
    location = str(model) if isinstance(model, Path) else resolve(model).location
    server = launch(location, port=free_port(), extra_args=extra_args, log_path=log_dir / "server.log")
    try:
        wait_ready(server, timeout_s=120)
        yield server
    finally:
        server.stop()


def openai_client(base_url: str):
    """The official SDK against a test's server: no key, no retries (a failure shows at once)."""
    import openai

    return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
