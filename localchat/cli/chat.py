"""``localchat chat``: open a backend, then answer one prompt or run the REPL."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from localchat.backends import Backend, GenerationParams
from localchat.backends.mlx_options import RuntimeOptions, server_fields
from localchat.chosen_settings import chosen_params
from localchat.cli import outcomes
from localchat.cli.images import attach, check_model_sees, read_pictures, server_picture_tokens
from localchat.cli.options import ChatOptions
from localchat.cli.render import ChatUI
from localchat.cli.repl import REPL_COMMANDS, Repl
from localchat.cli.resuming import resumed, resumed_line, resumed_tools_line
from localchat.conversation.attachment import BYTES_PER_CHAR
from localchat.conversation.compaction import CompactionPolicy
from localchat.conversation.history import Conversation, Summary, validate_input
from localchat.conversation.records import TurnRecorder, new_session_id
from localchat.conversation.turn import ChatSession, TurnStatus
from localchat.errors import UsageError, raise_on_sigterm
from localchat.grammar.answer_formats import (
    AnswerFormat,
    choice_format,
    default_schema,
    load_schema,
    regex_format,
    with_instruction,
)
from localchat.grammar.think_budget import DRAFT_AND_BUDGET, ThinkBudget
from localchat.home import keeps_conversations, records_dir
from localchat.registry import DEFAULT_MODEL, ModelRef, resolve
from localchat.sampling import SETTINGS
from localchat.store.keeper import SessionSaver, saved_state
from localchat.store.kv_files import cache_files
from localchat.store.saved_sessions import KEEPING_BUSY_TIMEOUT_S, SavedSession, default_store
from localchat.store.session_cache import SessionCaches

if TYPE_CHECKING:
    from localchat.tools.runner import ToolRunner
    from localchat.tools.settings import ToolSettings

def read_prompt(prompt: str, max_chars: int) -> str:
    """The PROMPT argument, or standard input for ``-`` (which must be valid UTF-8), less one final
    line break, as shells take a command's output (``$(cat f)`` drops it too)."""
    if prompt == "-":
        data = sys.stdin.buffer.read(max_chars * BYTES_PER_CHAR + 1)  # (never all of an endless stream)
        if len(data) > max_chars * BYTES_PER_CHAR:
            raise UsageError(f"standard input is over {max_chars} characters (--max-input-chars): nothing was sent")
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"standard input is not valid UTF-8 (byte {exc.start})") from None
        prompt = prompt.removesuffix("\n").removesuffix("\r")
    command = prompt.strip().split(" ", 1)[0]
    if command in REPL_COMMANDS:
        raise UsageError(f"{command} is a REPL command: start the REPL with `localchat chat` and type it "
                         "there (nothing was sent)")
    return validate_input(prompt, max_chars)


def _known_model(name: str | None) -> ModelRef | None:
    try:
        return resolve(name) if name else None
    except UsageError:
        return None


def _default(ref: ModelRef | None, name: str, fallback: Any) -> Any:
    return ref.default(name, fallback) if ref else fallback


def _given(ref: ModelRef | None, value: Any, name: str, fallback: Any) -> Any:
    """The flag's value when given, else the model's default (models.yaml), else ``fallback``."""
    return value if value is not None else _default(ref, name, fallback)


def generation_params(ref: ModelRef | None, opts: ChatOptions,
                      kept: Mapping[str, Any] | None = None) -> GenerationParams:
    """The flags, else the settings a resumed conversation was left with, else the model's defaults."""
    gen = opts.generation
    given = {name: getattr(gen, name) for name in SETTINGS}
    budget = ThinkBudget(tokens=gen.think_budget, message=gen.think_budget_message) \
        if gen.think_budget is not None else None
    return replace(chosen_params(ref, given, kept), seed=gen.seed, think=gen.think, think_budget=budget)


def runtime_options(ref: ModelRef | None, opts: ChatOptions) -> RuntimeOptions:
    """mlx_lm's load-time features: the flags, else the model's defaults, else mlx_lm's."""
    flags, base = opts.runtime, RuntimeOptions()
    adapter = _given(ref, flags.adapter_path, "adapter_path", None)
    if opts.generation.think_budget is not None and _given(ref, flags.draft_model, "draft_model", None):
        raise UsageError(DRAFT_AND_BUDGET)
    return RuntimeOptions(
        adapter_path=Path(adapter).expanduser() if adapter is not None else None,
        draft_model=_given(ref, flags.draft_model, "draft_model", None),
        num_draft_tokens=_given(ref, flags.num_draft_tokens, "num_draft_tokens", base.num_draft_tokens),
        kv_bits=_given(ref, flags.kv_bits, "kv_bits", None),
        kv_group_size=_given(ref, flags.kv_group_size, "kv_group_size", base.kv_group_size),
        quantized_kv_start=_given(ref, flags.quantized_kv_start, "quantized_kv_start", base.quantized_kv_start),
        max_kv_size=_given(ref, flags.max_kv_size, "max_kv_size", None),
    )


def system_message(ref: ModelRef | None, opts: ChatOptions) -> str | None:
    system = opts.generation.system if opts.generation.system is not None else _default(ref, "system", None)
    return system or None


def answer_schema(opts: ChatOptions) -> AnswerFormat | None:
    out = opts.output
    given = [flag for flag, on in (("--json", out.json_answer), ("--json-schema", out.json_schema is not None),
                                   ("--regex", out.regex is not None), ("--choice", out.choice is not None)) if on]
    if len(given) > 1:
        raise UsageError(f"{given[0]} and {given[1]} are alternatives: an answer has one format "
                         "(--json means the schema {\"answer\": string})")
    fmt = load_schema(out.json_schema) if out.json_schema else regex_format(out.regex) if out.regex is not None \
        else choice_format(out.choice) if out.choice is not None else default_schema() if out.json_answer else None
    if fmt is not None:  # a grammar that cannot be compiled, or admits no text: said before the model loads
        from localchat.grammar.compile import byte_tokenizer, check

        check(fmt, byte_tokenizer())
    return fmt


def conversation_for(ref: ModelRef | None, opts: ChatOptions, schema: AnswerFormat | None,
                     saved: SavedSession | None, backend: Backend) -> Conversation:
    system = saved.system if saved else system_message(ref, opts)
    if schema and schema.instruction not in (system or ""):
        system = with_instruction(system, schema)
    conversation = Conversation.for_backend(backend, system, saved.turns if saved else ())
    if saved:
        conversation.pins = list(saved.pins)
        conversation.summary = Summary(saved.summary) if saved.summary else None
    return conversation


def compaction_policy(opts: ChatOptions, ui: ChatUI) -> CompactionPolicy:
    """``--compact``'s settings, with ``--compact-model`` opened as a backend of the same kind."""
    context = opts.context
    other = None
    if context.compact_model:
        other = open_backend(replace(opts, model=replace(opts.model, model=context.compact_model)), ui)[1]
    return CompactionPolicy(auto=context.compact, trigger=context.compact_at, keep=context.compact_keep, backend=other)


def template_notices(session: ChatSession, ui: ChatUI) -> None:
    """What the model's chat template changes, said once: a folded or moving system message, a
    thinking switch that does nothing or something else (probed; nothing without a local template)."""
    template = session.backend.template
    if template is None:
        return
    for notice in template.traits.notices(session.backend.model_id, system=bool(session.conversation.system),
                                          think=session.params.think):
        ui.notice(notice)


def open_server(ref: ModelRef | None, opts: ChatOptions, ui: ChatUI) -> Backend:
    """An HTTP backend. A model the registry knows is sent as the location the server loads and
    lends its local tokenizer (for estimates); any other name (e.g. vLLM's served model name) is
    sent as it is; no name means the server's own model."""
    from localchat.backends.openai_http import SERVER_DEFAULT_MODEL, backend_for

    backend = backend_for(opts.model.base_url, ref, name=opts.model.model, api_key=opts.model.api_key,
                          timeout_s=opts.model.timeout_s)
    backend.extra_fields = server_fields(runtime_options(ref, opts), backend.model_field, SERVER_DEFAULT_MODEL)
    backend.image_tokens = server_picture_tokens(ref)
    ui.info(f"talking to {backend.url} (model: {backend.model_id})")
    return backend


def open_backend(opts: ChatOptions, ui: ChatUI, pictures: tuple = ()) -> tuple[ModelRef | None, Backend]:
    server = opts.model.backend == "server"
    ref = _known_model(opts.model.model) if server else resolve(opts.model.model or DEFAULT_MODEL)
    check_model_sees(ref, pictures)
    if server:
        return ref, open_server(ref, opts, ui)
    assert ref is not None  # (resolve always names one)
    from localchat.cli.ready import open_inproc

    return ref, open_inproc(ref, opts, ui, runtime_options(ref, opts))


def tool_runner(options: ToolSettings, ui: ChatUI, hidden: list[str]) -> ToolRunner | None:
    """The ``--tools`` files' functions (in their own process, without ``hidden``, the API key, in
    its environment) and the ``--mcp`` servers' tools; calls approved by ``--approve-tools``, else
    asked on a terminal, else refused (the refusal is what the model hears)."""
    if not options.offered:
        return None
    from localchat.toolbox import open_tools
    from localchat.tools.runner import Approve, approve_all, refuse_unasked

    approve: Approve
    if options.approve:
        approve = approve_all
    elif sys.stdin.isatty() and sys.stderr.isatty():
        from localchat.cli.approval import AskBeforeRunning, terminal_asker

        approve = AskBeforeRunning(ui, terminal_asker())
    else:
        approve = refuse_unasked
    with ui.err.status("starting MCP servers …") if options.mcp else nullcontext():
        runner = open_tools(options, approve, hidden=hidden, on_notice=ui.notice)
    how: dict[Any, str] = {approve_all: "",
                           refuse_unasked: " (no terminal to ask: calls are refused; --approve-tools runs them)"}
    offered = ", ".join(runner.names() if runner else []) or "none (no source offered a tool)"
    ui.info(f"tools offered: {offered}" + how.get(approve, " (each call asks first)"))
    return runner


def terminal() -> bool:
    """A person at a terminal: both ends of the REPL are one."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def typing_guard(interactive: bool) -> Callable[[], Any]:
    """What happens to keys typed while a reply streams: dropped and counted on a terminal."""
    from functools import partial

    from localchat.cli.repl.line_editor import KeysDropped, typed_ahead

    return partial(typed_ahead, sys.stdin) if interactive else lambda: nullcontext(KeysDropped())


def piped_line_reader(max_chars: int) -> Callable[[str], str]:
    from localchat.cli.repl.line_editor import piped_reader

    return piped_reader(sys.stdin.buffer, sys.stdout, max_chars)


def line_reader(opts: ChatOptions, ui: ChatUI) -> Callable[[str], str]:
    """Shell-like line editing on a terminal (prompt_toolkit)."""
    from localchat.cli.repl.line_editor import HISTORY_FILE, terminal_reader
    from localchat.home import home_dir

    path = home_dir() / HISTORY_FILE if opts.output.input_history else None
    return terminal_reader(path, REPL_COMMANDS, secrets=[opts.model.api_key or ""], on_notice=ui.notice)


def run_chat(*, opts: ChatOptions, prompt: str | None, err: Console) -> int:
    """Answer ``prompt``, or run the REPL when it is None; the exit code."""
    ui = ChatUI(err=err, show_stats=opts.output.stats, show_thinking=opts.output.show_thinking,
                json_mode=opts.output.formatted, json_answers=opts.output.answers_are_json,
                markdown=opts.output.markdown and sys.stdout.isatty(),
                hold_rounds=opts.tools.offered and not sys.stdout.isatty())
    status = chat_with_ui(opts=opts, prompt=prompt, ui=ui)
    return outcomes.OK if status is None else outcomes.turn_exit(status, opts.output.formatted)


def chat_with_ui(*, opts: ChatOptions, prompt: str | None, ui: ChatUI) -> TurnStatus | None:
    """Answer ``prompt`` and return its status, or run the REPL (None) when it is None."""
    if prompt is not None and not opts.history:
        raise UsageError("--no-history is for the REPL: a single prompt has no history to leave out")
    pictures = read_pictures(opts.context.images, prompt)  # before stdin is read for a prompt: one of them may be '-'
    text = read_prompt(prompt, opts.trim.max_input_chars) if prompt is not None else None
    schema = answer_schema(opts)
    keep = keeps_conversations(opts.storage.log)
    saved = resumed(opts, ui)
    if saved and opts.model.model is None:
        opts = replace(opts, model=replace(opts.model, model=saved.model))
    recorder = TurnRecorder(path) if (path := records_dir(opts.storage.record)) else None
    raise_on_sigterm()  # SIGTERM mid-reply: the turn is discarded and recorded, then exit 143
    tools = tool_runner(opts.tools, ui, hidden=[opts.model.api_key or ""])  # before the model loads: said at once
    try:
        ref, backend = open_backend(opts, ui, pictures)
        if tools:
            from localchat.toolbox import offer_tools

            offer_tools(backend, tools, ui.notice)
    except BaseException:
        if tools:
            tools.close()
        raise
    params = generation_params(ref, opts, saved.params if saved else None)
    if schema:
        params = replace(params, answer=schema)  # masked in-process; asked for, and checked, over HTTP
    session = ChatSession(backend=backend, conversation=conversation_for(ref, opts, schema, saved, backend),
                          params=params, use_history=opts.history, trim=opts.trim, schema=schema,
                          recorder=recorder, compaction=compaction_policy(opts, ui), tools=tools).prepare()
    for fact in opts.context.pins:
        session.pin(fact)
    attach(session, pictures, ui.info)
    template_notices(session, ui)
    caches = SessionCaches(cache_files(opts.storage.cache_max_bytes), write=opts.storage.save_cache)
    if saved:
        ui.info(resumed_line(saved, session, caches))
        if line := resumed_tools_line(saved, tools):
            ui.notice(line)
    if recorder:
        ui.info(f"recording turns in {recorder.directory} as {recorder.session_id}-NNNN-*.json")
    store = default_store(KEEPING_BUSY_TIMEOUT_S) if keep else default_store()
    saver = SessionSaver(store, saved.uid if saved else new_session_id(),
                         opts.model.model or (ref.id if ref else None), name=saved.name if saved else None,
                         caches=caches, logging=keep, revision=saved.revision if saved else 0,
                         saved_state=saved_state(saved) if saved else None)
    saver.start(session)
    try:
        if text is None:
            interactive = terminal()
            reader = line_reader(opts, ui) if interactive else \
                piped_line_reader(opts.trim.max_input_chars)
            Repl(session, ui, read_line=reader, saver=saver,
                 interactive=interactive, autosave=saved is not None,  # leaving a resumed session saves it again
                 while_replying=typing_guard(interactive)).run()
            return None
        result = session.ask(text, ui.listeners(), ui.compaction)
        ui.end_turn(result, session.params.max_tokens)
        if note := saver.kept(session):  # every accepted turn is kept as it commits
            ui.notice(note)
        return result.status
    finally:
        ui.stop_waiting()  # a turn refused before any call (its one line follows) leaves no spinner
        backend.close()
        if session.compaction is not None and session.compaction.backend is not None:
            session.compaction.backend.close()
        if tools:
            tools.close()
