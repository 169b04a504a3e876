"""``localchat chat``'s options: collected into ``ChatOptions`` and handed to ``cli.chat``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from localchat.backends import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S
from localchat.backends.mlx_options import KV_BITS, KV_GROUP_SIZES, MAX_DRAFT_TOKENS
from localchat.cli.dispatch import err_console, run
from localchat.cli.options import (
    AllowDownloadOpt,
    ApiKeyOpt,
    Backend,
    BaseUrlOpt,
    ChatOptions,
    Compact,
    CompactAtOpt,
    CompactKeepOpt,
    CompactOpt,
    ContextOptions,
    ForceOpt,
    GenerationOptions,
    MemoryLimitOpt,
    ModelOpt,
    ModelOptions,
    OutputOptions,
    RuntimeFlags,
    StorageOptions,
    ThinkOpt,
    TimeoutOpt,
    TrimToOpt,
    check_seed,
    check_size,
    check_text,
    converted,
    setting_callback,
)
from localchat.cli.think_options import ThinkBudgetMessageOpt, ThinkBudgetOpt, budget_tokens
from localchat.cli.tool_options import (
    ApproveToolsOpt,
    MaxToolRoundsOpt,
    McpOnlyOpt,
    McpOpt,
    McpTimeoutOpt,
    ToolsOpt,
    ToolTimeoutOpt,
    tool_settings,
)
from localchat.conversation.settings import DEFAULT_KEEP, DEFAULT_TRIGGER, DEFAULT_TRIM_TO, TrimPolicy

MLX = "mlx_lm, in-process"  # the help panel of the runtime options


def _choices(values: tuple[int, ...]) -> str:
    return ", ".join(map(str, values))


def chat(
    prompt: Annotated[
        Optional[str],
        typer.Argument(help="Answer this one prompt and exit ('-' reads stdin); without it, start the REPL."),
    ] = None,
    model: ModelOpt = None,
    backend: Annotated[
        Backend, typer.Option(help="inproc: mlx_lm in this process; server: an OpenAI-compatible server.")
    ] = Backend.inproc,
    base_url: BaseUrlOpt = DEFAULT_BASE_URL,
    api_key: ApiKeyOpt = None,
    system: Annotated[
        Optional[str],
        typer.Option(
            "--system",
            "-s",
            callback=check_text,
            help='System message ("" for none; default: the model\'s from models.yaml).',
        ),
    ] = None,
    temperature: Annotated[
        Optional[float],
        typer.Option(callback=setting_callback("temperature"), help="Sampling temperature (default 0.0: greedy)."),
    ] = None,
    top_p: Annotated[
        Optional[float],
        typer.Option(
            callback=setting_callback("top_p"), help="Nucleus sampling, in (0, 1] (default: the model's, else 1.0)."
        ),
    ] = None,
    top_k: Annotated[
        Optional[int],
        typer.Option(callback=setting_callback("top_k"), help="Sample from the K most likely tokens (0: off)."),
    ] = None,
    min_p: Annotated[
        Optional[float],
        typer.Option(
            callback=setting_callback("min_p"),
            help="Drop tokens below this share of the top token's probability (0: off).",
        ),
    ] = None,
    repetition_penalty: Annotated[
        Optional[float],
        typer.Option(
            callback=setting_callback("repetition_penalty"), help="Penalize the last 20 tokens' repeats (1.0: off)."
        ),
    ] = None,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="Longest reply, in tokens.")] = None,
    seed: Annotated[
        Optional[int], typer.Option(callback=check_seed, help="Random seed for sampling (set before each turn).")
    ] = None,
    think: ThinkOpt = None,
    think_budget: ThinkBudgetOpt = None,
    think_budget_message: ThinkBudgetMessageOpt = "",
    show_thinking: Annotated[
        bool,
        typer.Option(
            "--show-thinking",
            help="Stream a thinking model's reasoning (dim, on stderr) instead of a one-line counter.",
        ),
    ] = False,
    no_history: Annotated[bool, typer.Option("--no-history", help="REPL only: send each question alone.")] = False,
    max_turns: Annotated[
        Optional[int], typer.Option(min=0, help="Keep at most N past turns (oldest dropped first).")
    ] = None,
    max_context_tokens: Annotated[
        Optional[int], typer.Option(min=1, help="Drop oldest turns until the request fits N tokens.")
    ] = None,
    max_input_chars: Annotated[int, typer.Option(min=1, help="Longest accepted input, in characters.")] = 8000,
    trim_to: TrimToOpt = DEFAULT_TRIM_TO,
    compact: CompactOpt = Compact.off,
    compact_at: CompactAtOpt = DEFAULT_TRIGGER,
    compact_keep: CompactKeepOpt = DEFAULT_KEEP,
    compact_model: Annotated[
        Optional[str], typer.Option(help="Summarize with this model instead [default: the chat's].")
    ] = None,
    pin: Annotated[
        Optional[list[str]],
        typer.Option(callback=check_text, help="A fact kept after the system message, never trimmed; repeatable."),
    ] = None,
    image: Annotated[
        Optional[list[str]],
        typer.Option(
            metavar="FILE",
            help="A picture for the first question (PNG, JPEG, WebP, GIF, BMP; '-' reads stdin); repeatable; needs a "
                 "vision model and --extra vision.",
        ),
    ] = None,
    stats: Annotated[bool, typer.Option("--stats/--no-stats", help="Show the figures line after each reply.")] = True,
    plain: Annotated[
        bool, typer.Option("--plain", help="Show answers as raw text on a terminal too (no Markdown rendering).")
    ] = False,
    no_input_history: Annotated[
        bool, typer.Option("--no-input-history", help="REPL: do not keep what you type across sessions.")
    ] = False,
    no_cache_reuse: Annotated[
        bool, typer.Option("--no-cache-reuse", help="Re-prefill the whole prompt every turn (for benchmarks).")
    ] = False,
    allow_download: AllowDownloadOpt = False,
    memory_limit: MemoryLimitOpt = None,
    force: ForceOpt = False,
    json_answer: Annotated[
        bool, typer.Option("--json", help='Answers must be JSON {"answer": string}; invalid ones are not kept.')
    ] = False,
    json_schema: Annotated[
        Optional[Path],
        typer.Option(
            help="Answers must be JSON valid against this JSON Schema file (in-process: enforced while decoding)."
        ),
    ] = None,
    regex: Annotated[
        Optional[str],
        typer.Option(metavar="PATTERN", callback=check_text, help="Answers must match this regular expression, whole."),
    ] = None,
    choice: Annotated[
        Optional[str],
        typer.Option(
            metavar="A,B,…", callback=check_text, help="Answers must be exactly one of these (e.g. yes,no,unsure)."
        ),
    ] = None,
    record: Annotated[
        Optional[Path],
        typer.Option(
            help="Write each turn's request (before the call) and response as JSON files here [config: records_dir]."
        ),
    ] = None,
    resume: Annotated[
        Optional[str],
        typer.Option(
            metavar="[NAME]",
            help="Continue a conversation: a name from /save NAME or an id from `localchat log` (with its KV cache "
                 "when it still fits); alone, pick one of the recent ones.",
        ),
    ] = None,
    continue_latest: Annotated[bool, typer.Option("--continue", help="Continue the latest conversation.")] = False,
    no_log: Annotated[
        bool,
        typer.Option(
            "--no-log", help="Do not keep this conversation as it happens (only /save keeps it) [config: log]."
        ),
    ] = False,
    no_save_cache: Annotated[
        bool, typer.Option("--no-save-cache", help="/save keeps the messages only, not the in-process KV cache.")
    ] = False,
    cache_max_bytes: Annotated[
        Optional[str],
        typer.Option(
            callback=check_size,
            metavar="SIZE",
            help="Total size of saved KV caches, oldest evicted first (e.g. 2GB) [default: 4 GB; config: "
            "cache_max_bytes].",
        ),
    ] = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    tools: ToolsOpt = None,
    mcp: McpOpt = None,
    mcp_only: McpOnlyOpt = None,
    approve_tools: ApproveToolsOpt = False,
    tool_timeout: ToolTimeoutOpt = None,
    max_tool_rounds: MaxToolRoundsOpt = None,
    mcp_timeout: McpTimeoutOpt = None,
    adapter_path: Annotated[
        Optional[Path], typer.Option(rich_help_panel=MLX, help="A LoRA adapter directory from mlx_lm.lora.")
    ] = None,
    draft_model: Annotated[
        Optional[str],
        typer.Option(
            rich_help_panel=MLX, help="A smaller model with the same tokenizer drafts tokens (speculative decoding)."
        ),
    ] = None,
    num_draft_tokens: Annotated[
        Optional[int],
        typer.Option(min=1, max=MAX_DRAFT_TOKENS, rich_help_panel=MLX, help="Tokens drafted a step [default: 3]."),
    ] = None,
    kv_bits: Annotated[
        Optional[int],
        typer.Option(rich_help_panel=MLX, help=f"Quantize the KV cache to this many bits ({_choices(KV_BITS)})."),
    ] = None,
    kv_group_size: Annotated[
        Optional[int],
        typer.Option(rich_help_panel=MLX, help=f"Its group size ({_choices(KV_GROUP_SIZES)}) [default: 64]."),
    ] = None,
    quantized_kv_start: Annotated[
        Optional[int],
        typer.Option(
            min=0, rich_help_panel=MLX, help="Quantize from this many cached tokens on [default: 5000, mlx_lm's]."
        ),
    ] = None,
    max_kv_size: Annotated[
        Optional[int],
        typer.Option(
            min=1, rich_help_panel=MLX, help="A rotating KV cache of at most N tokens (the oldest are overwritten)."
        ),
    ] = None,
) -> None:
    """Chat with a model: one PROMPT, or the REPL."""
    tool_choice = tool_settings(files=tools, mcp=mcp, mcp_only=mcp_only, approve=approve_tools, timeout_s=tool_timeout,
                                max_rounds=max_tool_rounds, mcp_timeout_s=mcp_timeout)
    opts = ChatOptions(
        model=ModelOptions(model=model, backend=backend.value, base_url=base_url, api_key=api_key, timeout_s=timeout,
                           allow_download=allow_download, cache_reuse=not no_cache_reuse,
                           memory_limit=converted(memory_limit), force=force),
        runtime=RuntimeFlags(adapter_path=adapter_path, draft_model=draft_model, num_draft_tokens=num_draft_tokens,
                             kv_bits=kv_bits, kv_group_size=kv_group_size, quantized_kv_start=quantized_kv_start,
                             max_kv_size=max_kv_size),
        generation=GenerationOptions(system=system, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                     repetition_penalty=repetition_penalty, max_tokens=max_tokens, seed=seed,
                                     think=think, think_budget=budget_tokens(think_budget),
                                     think_budget_message=think_budget_message),
        history=not no_history,
        trim=TrimPolicy(max_turns=max_turns, max_context_tokens=max_context_tokens,
                        max_input_chars=max_input_chars, trim_to=trim_to),
        context=ContextOptions(compact=compact is Compact.auto, compact_at=compact_at, compact_keep=compact_keep,
                               compact_model=compact_model, pins=tuple(pin or ()),
                               images=tuple(image or ())),
        output=OutputOptions(stats=stats, json_answer=json_answer, json_schema=json_schema, regex=regex, choice=choice,
                             show_thinking=show_thinking, markdown=not plain, input_history=not no_input_history),
        storage=StorageOptions(record=record, resume=resume, continue_latest=continue_latest, log=not no_log,
                               save_cache=not no_save_cache,
                               cache_max_bytes=converted(cache_max_bytes)),
        tools=tool_choice,
    )
    from localchat.cli.chat import run_chat

    run(run_chat, opts=opts, prompt=prompt, err=err_console())
