"""``localchat chat``: open a backend, then answer one prompt or run the REPL."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from localchat.backends import Backend, GenerationParams
from localchat.backends.openai_http import DEFAULT_BASE_URL
from localchat.errors import UsageError
from localchat.history import DEFAULT_MAX_INPUT_CHARS, Conversation, validate_input
from localchat.home import records_dir
from localchat.jsonmode import AnswerSchema, default_schema, load_schema, with_instruction
from localchat.records import TurnRecorder, new_session_id
from localchat.registry import DEFAULT_MODEL, ModelRef, hub_snapshot, local_dir, quantization_bits, resolve
from localchat.render import ChatUI
from localchat.repl import Repl
from localchat.session import INTERRUPTED, ChatSession, TrimPolicy
from localchat.sessions import SavedSession, SessionSaver, default_store

DEFAULT_MAX_TOKENS = 512


@dataclass(frozen=True)
class ChatOptions:
    model: str | None = None  # None: "demo" in-process, the server's own model over HTTP
    system: str | None = None  # None: the model's default; "": no system message
    temperature: float | None = None
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None
    no_history: bool = False
    max_turns: int | None = None
    max_context_tokens: int | None = None
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS
    stats: bool = True
    cache_reuse: bool = True
    allow_download: bool = False
    backend: str = "inproc"  # "inproc" | "server"
    base_url: str = DEFAULT_BASE_URL
    api_key: str | None = None
    json_answer: bool = False
    json_schema: Path | None = None
    record: Path | None = None
    resume: str | None = None


def read_prompt(prompt: str, max_chars: int) -> str:
    """The PROMPT argument, or standard input for ``-`` (which must be valid UTF-8)."""
    if prompt == "-":
        try:
            prompt = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"standard input is not valid UTF-8 (byte {exc.start})") from None
    return validate_input(prompt, max_chars)


def _known_model(name: str | None) -> ModelRef | None:
    try:
        return resolve(name) if name else None
    except UsageError:
        return None


def _default(ref: ModelRef | None, name: str, fallback: Any) -> Any:
    return ref.default(name, fallback) if ref else fallback


def generation_params(ref: ModelRef | None, opts: ChatOptions) -> GenerationParams:
    return GenerationParams(
        temperature=opts.temperature if opts.temperature is not None else _default(ref, "temperature", 0.0),
        top_p=opts.top_p,
        max_tokens=opts.max_tokens or _default(ref, "max_tokens", DEFAULT_MAX_TOKENS),
        seed=opts.seed,
    )


def system_message(ref: ModelRef | None, opts: ChatOptions) -> str | None:
    system = opts.system if opts.system is not None else _default(ref, "system", None)
    return system or None


def answer_schema(opts: ChatOptions) -> AnswerSchema | None:
    if opts.json_answer and opts.json_schema:
        raise UsageError("--json and --json-schema are alternatives: --json means the schema {\"answer\": string}")
    if opts.json_schema:
        return load_schema(opts.json_schema)
    return default_schema() if opts.json_answer else None


def resumed(opts: ChatOptions) -> SavedSession | None:
    """The saved session to continue; its system message comes with it."""
    if opts.resume is None:
        return None
    if opts.system is not None:
        raise UsageError("--resume restores the saved system message: leave out --system")
    return default_store().load(opts.resume)


def conversation_for(ref: ModelRef | None, opts: ChatOptions, schema: AnswerSchema | None,
                     saved: SavedSession | None) -> Conversation:
    system = saved.system if saved else system_message(ref, opts)
    if schema and schema.instruction not in (system or ""):
        system = with_instruction(system, schema)
    return Conversation(system, list(saved.turns) if saved else [])


def load_local_tokenizer(ref: ModelRef) -> Any:
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(local_dir(ref))


def open_server(ref: ModelRef | None, opts: ChatOptions, ui: ChatUI) -> Backend:
    """An HTTP backend. A model the registry knows is sent as the location the server loads and
    lends its local tokenizer (for estimates); any other name (e.g. vLLM's served model name) is
    sent as it is; no name means the server's own model."""
    from localchat.backends.openai_http import backend_for

    loadable = ref is not None and (ref.kind != "hub" or hub_snapshot(ref.location) is not None)
    backend = backend_for(opts.base_url, ref, name=opts.model, api_key=opts.api_key,
                          load_tokenizer=partial(load_local_tokenizer, ref) if loadable else None)
    ui.info(f"talking to {backend.url} (model: {backend.model_id})")
    return backend


def open_inproc(ref: ModelRef, opts: ChatOptions, ui: ChatUI) -> Backend:
    """Load the model in this process, offline unless ``--allow-download``, behind a spinner."""
    if not opts.allow_download:
        os.environ["HF_HUB_OFFLINE"] = "1"  # read by huggingface_hub when mlx_lm first imports it
    from localchat.backends.inproc import load_inproc

    started = time.perf_counter()
    with ui.err.status(f"Loading {ref.id} …"):
        path = local_dir(ref, opts.allow_download)
        backend = load_inproc(ref, path, cache_reuse=opts.cache_reuse)
    bits = quantization_bits(path)
    quant = f", {bits}-bit" if bits else ""
    ui.info(f"loaded {ref.id} ({ref.kind}{quant}) in {time.perf_counter() - started:.2f}s")
    return backend


def run_chat(opts: ChatOptions, prompt: str | None, ui: ChatUI) -> int:
    """Answer ``prompt`` and return the exit code, or run the REPL when it is None."""
    if prompt is not None and opts.no_history:
        raise UsageError("--no-history is for the REPL: a single prompt has no history to leave out")
    text = read_prompt(prompt, opts.max_input_chars) if prompt is not None else None
    schema = answer_schema(opts)
    saved = resumed(opts)
    if saved and opts.model is None:
        opts = replace(opts, model=saved.model)
    recorder = TurnRecorder(path) if (path := records_dir(opts.record)) else None
    if opts.backend == "server":
        ref = _known_model(opts.model)
        backend = open_server(ref, opts, ui)
    else:
        ref = resolve(opts.model or DEFAULT_MODEL)
        backend = open_inproc(ref, opts, ui)
    params = generation_params(ref, opts)
    if schema and opts.backend == "server":
        params = replace(params, response_format=schema.response_format())
    session = ChatSession(
        backend=backend,
        conversation=conversation_for(ref, opts, schema, saved),
        params=params,
        use_history=not opts.no_history,
        trim=TrimPolicy(opts.max_turns, opts.max_context_tokens, opts.max_input_chars),
        schema=schema,
        recorder=recorder,
    )
    if saved:
        ui.info(f"resumed '{saved.name}': {len(saved.turns)} turn(s); the KV cache is rebuilt on the "
                "first turn (its whole prompt is prefilled)")
    if recorder:
        ui.info(f"recording turns in {recorder.directory} as {recorder.session_id}-NNNN-*.json")
    try:
        if text is None:
            saver = SessionSaver(default_store(), saved.uid if saved else new_session_id(),
                                 opts.model or (ref.id if ref else None), name=saved.name if saved else None)
            Repl(session, ui, saver=saver).run()
            return 0
        return answer_once(session, text, ui)
    finally:
        backend.close()


def answer_once(session: ChatSession, text: str, ui: ChatUI) -> int:
    result = session.ask(text, ui.text)
    ui.end_turn(result, session.params.max_tokens)
    if result.stats.finish_reason == INTERRUPTED:
        return 130
    if result.invalid:
        return 1
    return 0 if result.stats.finish_reason in ("stop", "length") else 1
