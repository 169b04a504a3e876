"""What the commands collect, in small groups passed whole and built by keyword.

The Typer declarations shared by several commands (``--model``, ``--base-url``, ``--api-key``)
are written once here; so are the groups a chat is run with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from localchat.backends import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S
from localchat.conversation.settings import TrimPolicy
from localchat.tools.settings import (
    ToolSettings,
)

MAX_SEED = 2**64 - 1  # mx.random.seed takes an unsigned 64-bit integer


def check_base_url(value: str | None) -> str | None:
    """An http(s) URL with a host and a valid port, parsed before anything is sent. Credentials in
    it (``user:key@host``) are refused without being shown: they would be printed and recorded."""
    import httpx

    if value is None:
        return None
    if "@" in value.split("//", 1)[-1].split("/", 1)[0]:  # the authority part, before any parsing
        raise typer.BadParameter("the URL holds credentials (user:password@): pass the key with --api-key or "
                                 "LOCALCHAT_API_KEY instead (the URL is not shown here)")
    try:
        url = httpx.URL(value)
        port = url.port
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise typer.BadParameter(f"{value!r} is not a URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise typer.BadParameter(f"{value!r} must be an http:// or https:// URL with a host, "
                                 "e.g. http://127.0.0.1:8080/v1")
    if port is not None and not 1 <= port <= 65535:
        raise typer.BadParameter(f"port {port} is out of range (1-65535)")
    return value


def check_api_key(value: str | None) -> str | None:
    from localchat.backends.http import check_api_key as check
    from localchat.errors import UsageError

    try:
        return check(value)
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None


def check_text(value: Any) -> Any:
    """A text flag (``--system``, ``--pin``, ``--regex``, ``--choice``) that holds bytes which were
    not UTF-8 (a shell passes any bytes) is refused here, before any model or tokenizer meets it."""
    from localchat.conversation.history import UNDECODED

    for text in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(text, str) and (bad := UNDECODED.search(text)) is not None:
            raise typer.BadParameter(f"not UTF-8 text (a byte that is not, at character {bad.start() + 1})")
    return value


def check_seed(value: int | None) -> int | None:
    if value is not None and not 0 <= value <= MAX_SEED:
        raise typer.BadParameter(f"must be a whole number from 0 to 2**64 - 1 ({MAX_SEED})")
    return value


def converted(value: Any) -> Any:
    """An option's value as its Typer callback returned it: declared as the text typed (``20GB``),
    it arrives converted (a number of bytes, a tuple of names), which the type checker cannot see."""
    return value


def check_size(value: str | None) -> int | None:
    """``--cache-max-bytes``: bytes, or a number with K, M, G or T."""
    from localchat.errors import UsageError
    from localchat.sizes import parse_size

    try:
        return parse_size(value) if value is not None else None
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None


def check_memory_limit(value: str | None) -> int | None:
    """``--memory-limit``: a size such as 12GB; nothing or 0 is refused."""
    from localchat.errors import UsageError
    from localchat.fit.budget import parse_limit

    try:
        return parse_limit(value) if value is not None else None
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None


def setting_callback(name: str) -> Callable[[Any], Any]:
    """A flag's check: the same one ``/set`` and models.yaml defaults go through."""
    from localchat.errors import UsageError
    from localchat.sampling import check_setting

    def check(value: Any) -> Any:
        if value is None:
            return None
        try:
            return check_setting(name, value)
        except UsageError as exc:
            raise typer.BadParameter(str(exc).removeprefix(f"{name} ")) from None

    return check


check_temperature = setting_callback("temperature")


MAX_WAIT_S = 86_400.0  # a day: beyond that a wait is a typo (and threads cannot wait on infinity)


def check_wait(value: float) -> float:
    """A pause: a finite number of seconds from 0 to a day."""
    if not (math.isfinite(value) and 0 <= value <= MAX_WAIT_S):
        raise typer.BadParameter(f"must be a number of seconds from 0 to {MAX_WAIT_S:.0f}")
    return value


def check_seconds(value: float | None) -> float | None:
    """A duration: a finite number of seconds > 0 (None: not given)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter("must be a finite number of seconds > 0")
    return value


def check_fraction(value: float | None) -> float | None:
    """A share of a budget: a number in (0, 1]."""
    if value is not None and not (math.isfinite(value) and 0 < value <= 1):
        raise typer.BadParameter("must be a fraction in (0, 1], e.g. 0.5")
    return value


class Compact(str, Enum):
    off = "off"
    auto = "auto"


TrimToOpt = Annotated[float, typer.Option(
    callback=check_fraction, help="Past the token budget, drop whole old turns down to this share of it, so the next "
                                  "turns reuse the KV cache (1.0: one turn at a time).")]
CompactOpt = Annotated[Compact, typer.Option(
    help="auto: once a prompt passes --compact-at of the budget, one model call turns old turns into notes.")]
CompactAtOpt = Annotated[float, typer.Option(callback=check_fraction, help="The share of the budget that triggers "
                                                                           "--compact auto.")]
CompactKeepOpt = Annotated[int, typer.Option(min=0, help="Turns kept verbatim after the notes.")]
MODEL_KINDS = "models.yaml id or alias, a local MLX model directory, or a Hugging Face repo id"


def model_option(purpose: str, default: str, also: str = "") -> Any:
    """``-m/--model``, its help saying what the command does with it and what it defaults to."""
    return typer.Option("--model", "-m", envvar="LOCALCHAT_MODEL", show_default=False, metavar="MODEL",
                        help=f"{purpose}: a {MODEL_KINDS}{also} [default: {default}].")


ModelOpt = Annotated[Optional[str], model_option("The model to chat with", "demo; with --backend server, the "
                                                                           "server's own model")]
LaunchedModelOpt = Annotated[Optional[str], model_option("The model to serve", "demo")]
BenchModelOpt = Annotated[Optional[str], model_option("The model to benchmark", "demo")]
ServedModelOpt = Annotated[Optional[str], model_option("The model to ask the server for", "the server's own model",
                                                       ", or a name only the server knows")]
LoadModelOpt = Annotated[Optional[str], model_option("The model to ask the server for", "the server's own model; "
                                                     "demo with --launch", ", or a name only the server knows")]
BaseUrlOpt = Annotated[str, typer.Option(envvar="LOCALCHAT_BASE_URL", callback=check_base_url, metavar="URL",
                                         help="OpenAI-compatible base URL.")]
def key_option(envvar: str, help: str, *names: str) -> Any:
    """An API key's option: read from ``envvar`` too, checked, never shown as a default."""
    return typer.Option(*names, envvar=envvar, show_default=False, callback=check_api_key, metavar="KEY", help=help)


ApiKeyOpt = Annotated[Optional[str], key_option("LOCALCHAT_API_KEY",
                                                "Bearer token for remote servers (never printed or recorded).")]
ThinkOpt = Annotated[Optional[bool], typer.Option(
    "--think/--no-think", show_default=False,
    help="A thinking model reasons before it answers, or answers directly (the template's enable_thinking) "
         "[default: the model's own].")]
MemoryLimitOpt = Annotated[Optional[str], typer.Option(
    callback=check_memory_limit, metavar="SIZE",
    help="What the model may take (e.g. 12GB), checked before it loads [default: config memory_limit, else "
         "Metal's recommended working set, or the memory available now].")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Load (or download) a model the memory check says "
                                                       "does not fit.")]
AllowDownloadOpt = Annotated[bool, typer.Option("--allow-download", help="Fetch a model missing from the Hugging "
                                                "Face cache first, as localchat pull does.")]
TimeoutOpt = Annotated[float, typer.Option(callback=check_seconds, envvar="LOCALCHAT_TIMEOUT", metavar="SECONDS",
                                           help="Give up on a server that makes no progress for this many seconds.")]


class Backend(str, Enum):
    inproc = "inproc"
    server = "server"


class BenchBackend(str, Enum):
    inproc = "inproc"
    server = "server"
    both = "both"


class OnOffBoth(str, Enum):
    """A setting to run with on, off, or both side by side (bench arms, load runs)."""

    on = "on"
    off = "off"
    both = "both"


class OutputFormat(str, Enum):
    table = "table"
    md = "md"
    json = "json"
    csv = "csv"


class ExportFormat(str, Enum):
    md = "md"
    json = "json"


@dataclass(frozen=True)
class ModelOptions:
    """Which model, and where it runs."""

    model: str | None = None  # None: "demo" in-process, the server's own model over HTTP
    backend: str = "inproc"  # "inproc" | "server"
    base_url: str = DEFAULT_BASE_URL
    api_key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    allow_download: bool = False
    cache_reuse: bool = True
    memory_limit: int | None = None  # --memory-limit; None: config.yaml's, else what the machine gives
    force: bool = False  # load a model the fit check says does not fit


@dataclass(frozen=True)
class GenerationOptions:
    """Sampling as the user asked for it; None means the model's default from models.yaml."""

    system: str | None = None  # None: the model's default; "": no system message
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    think: bool | None = None  # --think/--no-think; None: the model's default (models.yaml, then the template's)
    think_budget: int | None = None  # --think-budget: reasoning tokens at most
    think_budget_message: str = ""  # --think-budget-message: said before the forced end of reasoning


@dataclass(frozen=True)
class OutputOptions:
    stats: bool = True
    json_answer: bool = False
    json_schema: Path | None = None
    regex: str | None = None  # --regex PATTERN: the whole answer matches it
    choice: str | None = None  # --choice A,B,C: the answer is one of them

    @property
    def formatted(self) -> bool:
        """An answer format is asked for: stdout gets validated answers only."""
        return self.json_answer or self.json_schema is not None or self.regex is not None or self.choice is not None

    @property
    def answers_are_json(self) -> bool:
        """The format's answers are JSON (--json, --json-schema), printed as JSON; not --regex or --choice text."""
        return self.json_answer or self.json_schema is not None
    show_thinking: bool = False
    markdown: bool = True  # render answers on a terminal (--plain: raw text)
    input_history: bool = True  # the REPL's line history, kept across sessions


@dataclass(frozen=True)
class StorageOptions:
    record: Path | None = None
    resume: str | None = None  # "": --resume alone (pick one of the recent conversations)
    continue_latest: bool = False  # --continue
    log: bool = True  # --no-log: this conversation is kept only by /save

    save_cache: bool = True  # /save writes the in-process KV cache beside the session
    cache_max_bytes: int | None = None  # None: config.yaml's cache_max_bytes, else the default


@dataclass(frozen=True)
class ContextOptions:
    """What keeps a long conversation inside its budget, besides trimming: notes and pins."""

    compact: bool = False  # --compact auto
    compact_at: float = 0.8
    compact_keep: int = 2
    compact_model: str | None = None
    pins: tuple[str, ...] = ()
    images: tuple[str, ...] = ()  # --image: pictures the first question comes with


@dataclass(frozen=True)
class RuntimeFlags:
    """mlx_lm's load-time features as given on the command line; None: the model's default from
    models.yaml, then mlx_lm's (see ``backends.mlx_options.RuntimeOptions``)."""

    adapter_path: Path | None = None
    draft_model: str | None = None
    num_draft_tokens: int | None = None
    kv_bits: int | None = None
    kv_group_size: int | None = None
    quantized_kv_start: int | None = None
    max_kv_size: int | None = None


@dataclass(frozen=True)
class ChatOptions:
    model: ModelOptions = field(default_factory=ModelOptions)
    runtime: RuntimeFlags = field(default_factory=RuntimeFlags)
    generation: GenerationOptions = field(default_factory=GenerationOptions)
    history: bool = True
    trim: TrimPolicy = field(default_factory=TrimPolicy)
    context: ContextOptions = field(default_factory=ContextOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    storage: StorageOptions = field(default_factory=StorageOptions)
    tools: ToolSettings = field(default_factory=ToolSettings)
