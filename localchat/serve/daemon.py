"""``serve`` as a whole: the front on the public port and the pool of models behind it, or one
model on several ranks (``--ranks``), or the engine's command shown (``--dry-run``). ``cli``'s
``serve`` collects the options into a ``ServeRequest`` and calls ``run_serve`` by keyword."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from localchat.errors import LocalchatError, UsageError, raise_if_set, raise_on_sigterm
from localchat.fit.check import FitSettings
from localchat.registry import DEFAULT_MODEL, ModelRef, resolve
from localchat.serve.front.running import check_public, logger, serve_until_stopped
from localchat.serve.kv_options import KVChoice, engine_args, refuse_engine_kv_flags
from localchat.server.distributed import Ranks, check_ranks
from localchat.server.launch import (
    RunningServer,
    ServerStartError,
    default_log,
    free_port,
    port_is_free,
    server_command,
    serves_vision,
    start_ready,
)
from localchat.server.shown import ended_line, heeding, show_log_tail, shown_log_on_failure
from localchat.store.prompt_files import DEFAULT_MAX_BYTES
from localchat.wording import run_as


@dataclass(frozen=True)
class ServeRequest:
    """What ``serve`` was asked: the models (the first loaded at start), where, and how they are kept."""

    models: tuple[str, ...]
    host: str
    port: int
    log: Path | None = None
    extra: tuple[str, ...] = ()
    apis: tuple[str, ...] = ()
    api_key: str | None = None
    origins: tuple[str, ...] = ()
    image_urls: tuple[str, ...] = ()  # --allow-image-urls
    keep_alive: str = "5m"
    pins: tuple[str, ...] = ()
    upstreams: tuple[str, ...] = ()
    memory_limit: int | None = None
    force: bool = False
    plain: bool = False
    prompt_cache_dir: Path | None = None
    prompt_cache_disk: int = DEFAULT_MAX_BYTES
    tools: Any = None  # ToolSettings: what the page's conversations may call (approved in the page)
    results: Path | None = None  # bench and load plots shown in the page
    kv: KVChoice = KVChoice()  # --kv-bits (for all, or by name), --kv-group-size, --quantized-kv-start
    think_budget: int | None = None  # --think-budget: each request's default (a request's own field wins)
    think_budget_message: str = ""
    open_page: bool = False


Smoke = Callable[[str, ModelRef], int]  # ``serve --smoke``: the served URL and its first model → the exit code
Fetch = Callable[[ModelRef, FitSettings], None]  # ``--allow-download``: a model not on this machine pulled first


def run_serve(*, asked: ServeRequest, console: Console, err: Console, smoke: Smoke | None = None, every: bool = False,
              ranks: Ranks | None = None, dry_run: bool = False, fetch: Fetch | None = None) -> int:
    """Serve until Ctrl+C or SIGTERM (0), or run ``smoke`` and stop (its code); ``--dry-run``
    shows the engine's command and starts nothing."""
    from localchat.serve.pool.entries import present_models

    refuse_engine_kv_flags(asked.extra)
    if asked.plain and asked.think_budget is not None:
        raise UsageError("--think-budget is enforced by localchat's engine: leave out --plain (mlx_lm.server as it "
                         "is has no budget)")
    names = [*asked.models, *(present_models() if every else [])] or [DEFAULT_MODEL]
    ref = resolve(names[0])
    fit = FitSettings(memory_limit=asked.memory_limit, force=asked.force)
    if dry_run or ranks is not None:
        if len(names) > 1 or asked.upstreams:
            raise UsageError("--ranks and --hostfile serve one model: give one -m")
        if dry_run:
            return show_command(ref, asked, ranks, console)
    if fetch is not None:
        for name in names:
            fetch(resolve(name), fit)
    if ranks is not None:
        return run_ranks(ref, asked, ranks, fit, smoke, console, err)
    return run_router(names, asked, fit, smoke, console, err)


def show_command(ref: ModelRef, asked: ServeRequest, ranks: Ranks | None, console: Console) -> int:
    if ranks is not None:
        check_ranks(ranks, None)
    from localchat.serve.pool.entries import kv_settings_of

    extra = (*asked.extra, *engine_args(kv_settings_of(ref, asked.kv)))
    command = server_command(ref.location, asked.host, asked.port, extra, ranks, asked.plain,
                             serves_vision(ref, ranks))
    console.print(shlex.join(command), markup=False, overflow="ignore", crop=False)
    return 0


def run_router(names: list[str], asked: ServeRequest, fit: FitSettings, smoke: Smoke | None, console: Console,
               err: Console) -> int:
    """The front on the public port, the first model's engine child ready behind it, the others
    loaded when first asked for (docs/router.md)."""
    from localchat.fit.budget import machine_budget
    from localchat.processes import SERVED_ID
    from localchat.serve.front.metrics import ServeMetrics
    from localchat.serve.front.running import serve_gateway
    from localchat.serve.in_use import mark, unmark
    from localchat.serve.pool.entries import engine_launcher, engine_upstream, served_models
    from localchat.serve.pool.keep_alive import parse_keep_alive
    from localchat.serve.pool.pool import ModelPool
    from localchat.store.prompt_files import engine_env

    keep_alive = parse_keep_alive(asked.keep_alive)
    if not port_is_free(asked.host, asked.port):
        raise ServerStartError(f"port {asked.port} on {asked.host} is busy: stop what is using it, or pick another "
                               "with --port")
    check_public(asked.host, asked.port, asked.api_key, err)
    models = served_models(names, list(asked.pins), list(asked.upstreams), fit, asked.kv)
    first, log_path = models[0], asked.log or default_log(asked.port)
    if first.ref is None:
        raise UsageError(f"the first -m is loaded at start: {first.key} is an --upstream name, not a model here")
    env = engine_env(asked.prompt_cache_dir, asked.prompt_cache_disk) | budget_env(asked)
    launcher = engine_launcher(first.key, asked.port, log_path, asked.extra, asked.plain, bool(asked.apis), env)
    metrics = ServeMetrics(lambda: pool.status())
    pool = ModelPool(models, launcher,
                     budget=machine_budget(asked.memory_limit), keep_alive=keep_alive, force=asked.force,
                     log=logger(err), prompt_files=prompt_files_of(asked), events=metrics)
    terminated = raise_on_sigterm()
    running = web = None
    record = mark(asked.port, [m.ref.location for m in models if m.ref is not None])  # (what rm asks about)
    try:
        with console.status("starting mlx_lm.server …") as status, shown_log_on_failure(console):
            server = start_ready(first.ref, port=free_port(), log=log_path, fit=replace(fit, kv=first.kv),
                                 extra=(*asked.extra, *engine_args(first.kv)),
                                 on_poll=heeding(terminated, status.update), plain=asked.plain,
                                 env=env | {SERVED_ID: first.key})
            pool.load_at_start(first, server, engine_upstream(server, first.ref, bool(asked.apis)))
            for pinned in (m for m in models[1:] if m.pinned):
                status.update(f"loading {pinned.key} (pinned) …")
                pool.lease(pinned.key).release()
            status.update("starting the front …")
            web = chat_page(pool, models, asked, keep_alive)
            running = serve_gateway(pool, asked.host, asked.port, asked.apis, asked.api_key, logger(err),
                                    status.update, asked.origins, model=first.key, web=web,
                                    image_urls=asked.image_urls, metrics=metrics)
        pool.run_reaper()
        show_ready(console, running.url, models, server, log_path, asked, keep_alive)
        if asked.open_page:
            import webbrowser

            if not webbrowser.open(running.url + "/"):
                console.print(f"no browser to open here: the chat page is at {running.url}/", markup=False)
        if smoke is not None:
            return smoke(running.url + "/v1", first.ref)
        return serve_until_stopped(running, terminated, "the server's front stopped")
    except KeyboardInterrupt:
        return 0
    finally:
        if running is not None:
            running.stop()
        if web is not None:
            web.chats.close()
        pool.close()
        unmark(record)
        console.print("server stopped", style="dim")


def chat_page(pool: Any, models: list, asked: ServeRequest, keep_alive: float | None) -> Any:
    """The page at ``/`` and its API: conversations of the log, each turn on its model by a lease
    from the pool, as every API's request."""
    from localchat.serve.page.api import WebApi
    from localchat.serve.page.chats import WebChats
    from localchat.vision.support import is_vision

    tools = None
    if asked.tools is not None and asked.tools.offered:
        from localchat.toolbox import open_tools

        settings = asked.tools

        def tools(ask: Any) -> Any:  # each conversation its own tool processes; calls asked in the page
            return open_tools(settings, ask if not settings.approve else approve_all(), hidden=[asked.api_key or ""])
    chats = WebChats(lease=pool.lease, served=pool.model_ids, tools=tools, keep_alive=keep_alive, loaded=pool.loaded)
    vision = frozenset(m.key for m in models if m.ref is not None and is_vision(m.ref))
    return WebApi(chats, api_key=asked.api_key, vision=vision, results=asked.results)


def approve_all() -> Any:
    from localchat.tools.runner import approve_all as every_call

    return every_call


def prompt_files_of(asked: ServeRequest):
    """The disk tier serve keeps (None with ``--prompt-cache-disk 0``)."""
    from localchat.store.prompt_files import PromptFiles, default_root

    if asked.prompt_cache_disk <= 0:
        return None
    return PromptFiles(asked.prompt_cache_dir or default_root(), asked.prompt_cache_disk)


def show_ready(console: Console, url: str, models: list, server: RunningServer, log_path: Path,
               asked: ServeRequest, keep_alive: float | None) -> None:
    from localchat.serve.pool.keep_alive import shown

    first = models[0]
    apis = f" · {', '.join(asked.apis)}" if asked.apis else ""
    console.print(f"[green]ready[/green] {url}{apis} · model {escape(first.key)} ({escape(first.ref.location)}) · "
                  f"loaded in {server.load_s:.1f}s · log {escape(str(log_path))}")
    if len(models) > 1:
        later = ", ".join(m.key + (" (pinned)" if m.pinned else " (elsewhere)" if m.remote else "") for m in models[1:])
        console.print(f"also served, loaded when first asked for: {escape(later)} · idle models unload after "
                      f"{shown(keep_alive)}", style="dim")
    else:
        console.print(f"{escape(first.key)} unloads after {shown(keep_alive)} idle and loads again when next asked for "
                      "(--keep-alive)" if keep_alive is not None else f"{escape(first.key)} stays loaded (--keep-alive "
                      "never)", style="dim")
    console.print(f"the chat page: {url}/", markup=False, overflow="ignore", crop=False)
    console.print("chat with:", style="dim")
    console.print(f"  {run_as()} chat --backend server --base-url {url}/v1 -m {first.key}",
                  markup=False, overflow="ignore", crop=False)
    if "anthropic" in asked.apis:
        console.print(f"  ANTHROPIC_BASE_URL={url}  (Claude Code, the anthropic SDK)", markup=False,
                      overflow="ignore", crop=False)
    if "responses" in asked.apis:
        console.print(f"  base_url={url}/v1  (the openai SDK's responses, Codex CLI)", markup=False,
                      overflow="ignore", crop=False)
    console.print("Ctrl+C stops the server.", style="dim")


def run_ranks(ref: ModelRef, asked: ServeRequest, ranks: Ranks, fit: FitSettings, smoke: Smoke | None,
              console: Console, err: Console) -> int:
    """One model on several ranks: mlx.launch's server on a loopback port, an entry of a pool of one
    behind the front on the public port, as every model ``serve`` serves (its name, keys, APIs)."""
    from localchat.processes import SERVED_ID
    from localchat.serve.front.running import serve_gateway
    from localchat.serve.pool.entries import engine_upstream, kv_settings_of, upstream_pool

    check_public(asked.host, asked.port, asked.api_key, err)
    kv = kv_settings_of(ref, asked.kv)
    terminated = raise_on_sigterm()
    with console.status("starting mlx_lm.server …") as status, shown_log_on_failure(console):
        server = start_ready(ref, port=free_port(), log=asked.log, extra=(*asked.extra, *engine_args(kv)),
                             on_poll=heeding(terminated, status.update), ranks=ranks, fit=replace(fit, kv=kv),
                             plain=asked.plain, env=budget_env(asked) | {SERVED_ID: ref.id})
    where = f" · {ranks.size} ranks ({ranks.backend}{', pipeline' if ranks.pipeline else ''})"
    front = None
    try:
        front = serve_gateway(upstream_pool(engine_upstream(server, ref, bool(asked.apis))), asked.host, asked.port,
                              asked.apis, asked.api_key, logger(err), origins=asked.origins, model=ref.id,
                              image_urls=asked.image_urls)
        url = front.url + "/v1"
        console.print(f"[green]ready[/green] {url} · model {ref.id} ({ref.location}){where} · "
                      f"loaded in {server.load_s:.1f}s · log {server.log_path}")
        if smoke is not None:
            return smoke(url, ref)
        console.print("chat with:", style="dim")
        console.print(f"  {run_as()} chat --backend server --base-url {url} -m {ref.id}",
                      markup=False, overflow="ignore", crop=False)
        console.print("Ctrl+C stops the server.", style="dim")
        while server.process.poll() is None and front.alive:
            raise_if_set(terminated)
            time.sleep(0.5)
        server.stop()  # what the launcher left: every rank ends before the line is said
        show_log_tail(console, server.log_path)
        raise LocalchatError(ended_line(server, ranks))
    except KeyboardInterrupt:
        return 0
    finally:
        if front is not None:
            front.stop()
        running = server.process.poll() is None
        server.stop()  # returns once every rank has exited (and what a launcher that died left), its files gone
        if running:
            console.print("server stopped (every rank)", style="dim")


def budget_env(asked: ServeRequest) -> dict[str, str]:
    """``--think-budget`` for the engines serve starts (their own arguments are mlx_lm.server's)."""
    from localchat.serve.engine.think_budgets import BUDGET_ENV, MESSAGE_ENV

    if asked.think_budget is None:
        return {}
    return {BUDGET_ENV: str(asked.think_budget), MESSAGE_ENV: asked.think_budget_message}
