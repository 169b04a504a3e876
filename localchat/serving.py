"""The ``serve``, ``smoke`` and ``parity`` commands: launch, check and compare a server."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from localchat.backends import GenerationParams
from localchat.backends.openai_http import backend_for
from localchat.errors import LocalchatError
from localchat.history import Conversation
from localchat.registry import DEFAULT_MODEL, ModelRef, local_dir, resolve
from localchat.server import LOOPBACK, RunningServer, free_port, launch, raise_on_sigterm, wait_ready
from localchat.session import ChatSession
from localchat.smoke import SmokeReport, run_smoke

DEMO_ID = "demo"


def default_log(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"localchat-server-{port}.log"


def ensure_hf_cache_dir() -> None:
    """mlx_lm.server's /v1/models sends 200 and then fails when the HF cache directory does not
    exist (ml-explore/mlx-lm#1636); an empty cache directory is what ``hf download`` makes anyway."""
    from huggingface_hub import constants

    Path(constants.HF_HUB_CACHE).mkdir(parents=True, exist_ok=True)


def start_ready(ref: ModelRef, host: str, port: int, log: Path | None, extra: tuple[str, ...],
                console: Console) -> RunningServer:
    """Launch mlx_lm.server for ``ref`` and wait (spinner) until a completion succeeds."""
    local_dir(ref)  # fail early, in one line, when the model is not on this machine
    ensure_hf_cache_dir()
    server = launch(ref.location, host=host, port=port, log_path=log or default_log(port), extra_args=extra)
    try:
        with console.status(f"starting mlx_lm.server with {ref.id} on port {port} …") as status:
            wait_ready(server, on_poll=lambda s: status.update(
                f"loading {ref.id} in mlx_lm.server … {s:.0f}s (waiting for a 1-token completion)"))
    except BaseException:
        server.stop()
        raise
    return server


def show_smoke(console: Console, report: SmokeReport, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(report.as_dict()))
        return
    table = Table("check", "result", "time", "detail", title=f"smoke: {report.base_url} ({report.model})")
    for c in report.checks:
        mark = "[green]pass[/green]" if c.ok else ("[red]FAIL[/red]" if c.required else "[yellow]fail[/yellow]")
        table.add_row(c.name, mark, f"{c.seconds:.2f}s", escape(c.detail))
    console.print(table)
    console.print("[green]all required checks passed[/green]" if report.ok else "[red]smoke test failed[/red]")


def run_serve(model: str | None, host: str, port: int, log: Path | None, smoke: bool,
              extra: tuple[str, ...], console: Console) -> int:
    ref = resolve(model or DEFAULT_MODEL)
    if host not in LOOPBACK:
        console.print(f"[yellow]warning: binding {host}: mlx_lm.server has no authentication; "
                      "anyone who can reach this port can use the model[/yellow]")
    raise_on_sigterm()
    server = start_ready(ref, host, port, log, extra, console)
    try:
        console.print(f"[green]ready[/green] {server.base_url} · model {ref.id} ({ref.location}) · "
                      f"loaded in {server.load_s:.1f}s · log {server.log_path}")
        if smoke:
            report = run_smoke(backend_for(server.base_url, ref), judge_recall=ref.id == DEMO_ID)
            show_smoke(console, report, as_json=False)
            return 0 if report.ok else 1
        console.print(f"chat with: localchat chat --backend server --base-url {server.base_url} -m {ref.id}")
        console.print("Ctrl+C stops the server.", style="dim")
        while server.process.poll() is None:
            time.sleep(0.5)
        raise LocalchatError(f"mlx_lm.server exited with code {server.process.returncode}; see {server.log_path}")
    except KeyboardInterrupt:
        return 0
    finally:
        code = server.stop()
        console.print(f"server stopped (exit code {code})", style="dim")


def run_smoke_cmd(base_url: str, model: str | None, api_key: str | None, as_json: bool,
                  console: Console) -> int:
    ref = resolve(model) if model else None
    backend = backend_for(base_url, ref, api_key=api_key)
    try:
        report = run_smoke(backend, judge_recall=ref is not None and ref.id == DEMO_ID)
    finally:
        backend.close()
    show_smoke(console, report, as_json)
    return 0 if report.ok else 1


PARITY_TURNS = ("Remember the code harbor 17. Reply only OK.", "How are you?",
                "What was the code? Reply with the code only.")


@dataclass
class ParityReport:
    model: str
    turns: list[dict] = field(default_factory=list)
    first_difference: str | None = None

    @property
    def ok(self) -> bool:
        return self.first_difference is None


def _conversation(backend, ref: ModelRef) -> list:
    session = ChatSession(backend, Conversation(ref.default("system")),
                          GenerationParams(temperature=0.0, max_tokens=ref.default("max_tokens", 256)))
    return [session.ask(turn) for turn in PARITY_TURNS]


def compare(inproc_results: list, server_results: list, tokenizer) -> ParityReport:
    report = ParityReport(model="")
    for i, (a, b) in enumerate(zip(inproc_results, server_results), 1):
        report.turns.append({"turn": i, "inproc_prompt_tokens": a.stats.prompt_tokens,
                             "server_prompt_tokens": b.stats.prompt_tokens,
                             "inproc_text": a.text, "server_text": b.text})
        if report.first_difference:
            continue
        if a.stats.prompt_tokens != b.stats.prompt_tokens:
            report.first_difference = (f"turn {i}: prompt tokens {a.stats.prompt_tokens} in-process "
                                       f"vs {b.stats.prompt_tokens} via the server")
        elif a.text != b.text:
            ta, tb = tokenizer.encode(a.text), tokenizer.encode(b.text)
            k = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            report.first_difference = f"turn {i}, reply token {k}: {a.text!r} vs {b.text!r}"
    return report


def run_parity(model: str | None, console: Console) -> ParityReport:
    from localchat.backends.inproc import load_inproc

    ref = resolve(model or DEFAULT_MODEL)
    with console.status(f"loading {ref.id} in-process …"):
        inproc = load_inproc(ref, local_dir(ref))
    inproc_results = _conversation(inproc, ref)
    port = free_port()
    server = start_ready(ref, "127.0.0.1", port, None, (), console)
    try:
        backend = backend_for(server.base_url, ref)
        server_results = _conversation(backend, ref)
        backend.close()
    finally:
        server.stop()
    report = compare(inproc_results, server_results, inproc.tokenizer)
    report.model = ref.id
    return report


def show_parity(console: Console, report: ParityReport, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(asdict(report) | {"ok": report.ok}))
        return
    table = Table("turn", "prompt tokens (inproc / server)", "in-process reply", "server reply",
                  title=f"parity at temperature 0: {report.model}")
    for t in report.turns:
        table.add_row(str(t["turn"]), f"{t['inproc_prompt_tokens']} / {t['server_prompt_tokens']}",
                      escape(repr(t["inproc_text"])), escape(repr(t["server_text"])))
    console.print(table)
    console.print("[green]identical prompts and greedy replies[/green]" if report.ok
                  else f"[red]first difference: {escape(report.first_difference or '')}[/red]")
