"""mlx_lm.server with what a client asks enforced while decoding: ``response_format``,
``tool_choice``, and localchat's ``guided_regex``/``guided_choice``, under the same grammar mask
as in-process (``backends.masking``). ``python -m localchat.serve.engine.enforcing`` takes mlx_lm.server's
own arguments; ``localchat serve`` runs it (``serve --plain`` runs mlx_lm.server as it is).

Everything else is mlx_lm.server's own engine: its request handling, prompt cache, batching and
distributed ranks. What this module uses of it is listed and checked in ``seam`` (docs/structured-output.md):

- ``APIHandler.handle_completion``: the request's fields are read and checked here, before anything
  is generated (a format the grammar cannot compile is a 400 in OpenAI's error shape); what is to be
  enforced travels in our own request type (``requested.EnforcedRequest``: plain data, so ranks
  receive it too).
- ``ResponseGenerator._tokenize``: with the prompt's ids and the tokenizer at hand, the reply's mask
  (``MaskedDecoding``) is made and kept in ``ReplyMasks``, by the request's generation arguments.
- ``mlx_lm.server._make_sampler`` / ``_make_logits_processors``: the engine builds one sampler and one
  list of processors per request, in its batched path and its single one alike; the mask joins them.
- ``APIHandler.generate_response`` / ``completion_usage_response``: every reply names the model by
  the id ``serve`` gave this engine (``SERVED_ID``), so the front relays its bytes as they are.
- ``mlx_lm.server.run``: it accepts a handler class but does not pass it on; ours does. There the
  KV caches become ours (``kv_caches``: ``--kv-bits`` keeps the batch) and the disk tier is put
  under the prompt cache (``prompt_disk``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localchat.processes import SERVED_ID
from localchat.serve.engine import seam
from localchat.serve.engine.hangup import HangupWatch
from localchat.serve.engine.requested import Enforcement, RequestRefused, enforced_request, enforcement_of

ENFORCED_HEADER = "X-Localchat-Enforced"
KV_PATH = "/localchat/kv"  # the bits and the bytes of the engine's KV caches (``kv_caches``), for ``ps``
KV_SETTINGS = ("kv_bits", "kv_group_size", "quantized_kv_start")


class ReplyMasks:
    """Each request's mask, by its generation arguments (what the sampler and processors are made
    from); an entry goes when its arguments do."""

    def __init__(self) -> None:
        self._masks: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def put(self, args: Any, mask: tuple[Any, Any] | None) -> None:
        if mask is None:
            return
        with self._lock:
            self._masks[id(args)] = mask
        weakref.finalize(args, self._forget, id(args))

    def of(self, args: Any) -> tuple[Any, Any] | None:
        with self._lock:
            return self._masks.get(id(args))

    def _forget(self, key: int) -> None:
        with self._lock:
            self._masks.pop(key, None)


class Windows:
    """The served model's context window, from its config (read once)."""

    def __init__(self) -> None:
        self._known: dict[str, int | None] = {}

    def of(self, model: str) -> int | None:
        if model not in self._known:
            from localchat.registry import context_length, hub_snapshot, read_config

            local = Path(model).expanduser()
            directory = local if local.is_dir() else hub_snapshot(model)
            self._known[model] = context_length(read_config(directory)) if directory is not None else None
        return self._known[model]


class Contexts:
    """The running requests' generation contexts (what stops one), by request, for the hangup watch."""

    def __init__(self) -> None:
        self._running: dict[int, Any] = {}

    def started(self, request: Any, context: Any) -> None:
        self._running[id(request)] = context

    def of(self, request: Any) -> Any:
        return self._running.get(id(request))

    def ended(self, request: Any) -> None:
        self._running.pop(id(request), None)


class _Masks:
    """The loaded tokenizer's grammar setup and template traits, read once (llguidance's view of a
    49k vocabulary takes about a second: the first formatted request waits for it), again when the
    server loads another model."""

    def __init__(self) -> None:
        self._for: tuple[Any, Any, Any] | None = None  # (tokenizer, setup, traits)

    def of(self, tokenizer: Any, model: Any) -> tuple[Any, Any]:
        from localchat.backends.masking import GrammarSetup
        from localchat.templates.render import ChatTemplate

        if self._for is None or self._for[0] is not tokenizer:
            setup = GrammarSetup(tokenizer, getattr(getattr(model, "args", None), "vocab_size", None))
            self._for = (tokenizer, setup, ChatTemplate(tokenizer, "served model").traits)
        return self._for[1], self._for[2]


class EndOnDeadEnd:
    """The mask as the engine calls it: a reply the grammar can take no further ends here (its end
    token only), said in the server's log, instead of an exception in the engine's thread."""

    def __init__(self, masked: Any, eos: tuple[int, ...]) -> None:
        self.masked, self.eos, self.ended = masked, eos, False

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        from localchat.grammar.mask import DeadEnd

        if not self.ended:
            try:
                return self.masked(tokens, logits)
            except DeadEnd as exc:
                logging.warning("localchat: a reply ended early: %s", exc)
                self.ended = True
        keep = mx.zeros(logits.shape[-1], dtype=mx.bool_)
        keep[list(self.eos)] = True
        return mx.where(keep, logits, mx.array(-float("inf"), dtype=logits.dtype))


def mask_for(enforcement: Enforcement, tokenizer: Any, model: Any, prompt: list[int], masks: _Masks):
    """The reply's processor and the sampler wrapper it needs, or None when nothing is enforced."""
    setup, traits = masks.of(tokenizer, model)
    banned = enforcement.banned_marker(traits, tokenizer)
    masked = setup.for_reply(enforcement.answer(), enforcement.tools, traits, prompt, offset=0,
                             calls_required=enforcement.calls == "required")
    if masked is None and banned is None:
        return None
    return masked, banned


def install(server: Any) -> None:
    """Add the mask to mlx_lm.server's engine through the seam (in this process only)."""
    make_sampler, make_processors = server._make_sampler, server._make_logits_processors
    masks, replies, contexts, windows = _Masks(), ReplyMasks(), Contexts(), Windows()
    request_type = enforced_request(server.CompletionRequest)
    served_id = os.environ.get(SERVED_ID) or None

    def sampler(args: Any, tokenizer: Any) -> Any:
        inner = make_sampler(args, tokenizer)
        made = replies.of(args)
        return made[0].sampler(inner) if made and made[0] is not None else inner

    def processors(args: Any) -> list[Any]:
        made = replies.of(args)
        extra = []
        if made:
            masked, banned = made
            extra = [p for p in (banned, EndOnDeadEnd(masked, tuple(masked.llg.eos_tokens)) if masked else None) if p]
        return [*make_processors(args), *extra]

    class Generator(server.ResponseGenerator):
        def generate(self, request, generation_args, progress_callback=None):
            context, response = super().generate(request, generation_args, progress_callback)
            contexts.started(request, context)
            return context, response

        def _tokenize(self, tokenizer, request, args):
            tokenized = super()._tokenize(tokenizer, request, args)
            if isinstance(request, request_type) and request.enforcement is not None:
                model = self.model_provider.model
                replies.put(args, mask_for(request.enforcement, tokenizer, model, list(tokenized[0]), masks))
            return tokenized

    class Handler(server.APIHandler):
        enforced: str | None = None
        kv_report: Callable[[], bytes] | None = None  # ``GET /localchat/kv`` (set in ``run``)

        def handle_completion(self, request, stop_words):
            self.enforced = None  # each request its own (were connections kept alive, a handler would serve several)
            try:
                enforcement = enforcement_of(self.body)
                self._check_calls(enforcement)
                self._check_window(request)
            except RequestRefused as exc:
                return self._refuse(exc)
            if enforcement is not None:
                request = request_type(**vars(request), enforcement=enforcement)
                if enforcement.calls == "none":
                    request.tools = None  # no call can start: the template offers none
                self.enforced = enforcement.kind
            try:
                with HangupWatch(self.connection, lambda: contexts.of(request)):
                    return super().handle_completion(request, stop_words)
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                self.close_connection = True  # a client that hung up is a normal event: one line, no traceback
                logging.warning("localchat: the client hung up mid-reply; its reply is no longer generated")
                return None
            finally:
                contexts.ended(request)

        def generate_response(self, *args, **kwargs):
            return named(super().generate_response(*args, **kwargs), served_id)

        def completion_usage_response(self, *args, **kwargs):
            return named(super().completion_usage_response(*args, **kwargs), served_id)

        def _check_calls(self, enforcement: Enforcement | None) -> None:
            """A call that must come, from a model whose chat template takes no tools, is refused: its
            prompt would not even show the tools (the header would claim what was not done)."""
            provider = self.response_generator.model_provider
            tokenizer, model = getattr(provider, "tokenizer", None), getattr(provider, "model", None)
            if enforcement is None or enforcement.calls != "required" or tokenizer is None:
                return
            if masks.of(tokenizer, model)[1].tool_format is None:
                raise RequestRefused("the served model's chat template takes no tools, so no call can be enforced: "
                                     "serve a model that calls tools (e.g. localchat serve -m demo-tools)", "tools")

        def _check_window(self, request) -> None:
            """A prompt longer than the model's window is refused with the counts (the engine would
            answer past it with noise). Counted only when it could be: a prompt's tokens are never
            more than its bytes (and the template's)."""
            provider = self.response_generator.model_provider
            tokenizer, window = getattr(provider, "tokenizer", None), windows.of(provider.cli_args.model)
            if tokenizer is None or window is None or len(json.dumps(self.body)) + 4096 <= window:
                return
            try:
                if request.request_type == "chat":
                    tokens = tokenizer.apply_chat_template(request.messages, tools=request.tools, tokenize=True,
                                                           add_generation_prompt=True)
                else:
                    tokens = tokenizer.encode(request.prompt)
            except Exception:  # noqa: BLE001 - a prompt the template refuses: the engine says why itself
                return
            if len(tokens) > window:
                raise RequestRefused(f"the prompt is {len(tokens):,} tokens, over {served_id or 'the model'}'s "
                                     f"context window of {window:,}: shorten it, or serve a model with a longer "
                                     "window", "messages" if request.request_type == "chat" else "prompt")

        def _refuse(self, exc: RequestRefused) -> None:
            self._set_completion_headers(400)
            self.end_headers()
            self.wfile.write(json.dumps({"error": {"message": str(exc), "type": "invalid_request_error",
                                                   "param": exc.param, "code": None}}).encode())

        def do_GET(self):
            if self.path != KV_PATH or self.kv_report is None:
                return super().do_GET()
            self._set_completion_headers(200)
            self.end_headers()
            self.wfile.write(self.kv_report())

        def _set_completion_headers(self, status_code: int = 200):
            super()._set_completion_headers(status_code)
            if self.enforced and status_code == 200:
                self.send_header(ENFORCED_HEADER, self.enforced)

        def _set_stream_headers(self, status_code: int = 200):
            super()._set_stream_headers(status_code)
            if self.enforced and status_code == 200:
                self.send_header(ENFORCED_HEADER, self.enforced)

    def run(host: str, port: int, model_provider: Any, server_class=server.ThreadingHTTPServer,
            handler_class=Handler) -> None:
        import mlx.core as mx

        from localchat.serve.engine import kv_caches
        from localchat.serve.engine.prompt_disk import disk_tier, tiered

        group = mx.distributed.init()
        settings = {name: getattr(model_provider.cli_args, name, None) for name in KV_SETTINGS}
        quantization, ledger = kv_caches.install(server, model_provider.cli_args)
        handler_class.kv_report = staticmethod(lambda: kv_caches.report(quantization, ledger))
        disk = disk_tier(settings, quantization) if group.size() == 1 else None  # (ranks hold shards of it)
        cache = tiered(seam.cache_files().LRUPromptCache, disk)(model_provider.cli_args.prompt_cache_size)
        response_generator = Generator(model_provider, cache)
        if group.rank() == 0:
            server._run_http_server(host, port, response_generator, server_class, handler_class)
        else:
            response_generator.join()

    server._make_sampler, server._make_logits_processors, server.run = sampler, processors, run


def named(response: dict[str, Any], served_id: str | None) -> dict[str, Any]:
    """A reply as the engine writes it, its model named by the id ``serve`` serves it by."""
    if served_id is not None and "model" in response:
        response["model"] = served_id
    return response


def main() -> None:
    server = seam.server()  # (one line and no start on an mlx-lm that lacks a part)
    die_with_serve()
    install(server)
    sys.argv[0] = "mlx_lm.server"
    server.main()


def die_with_serve() -> None:
    """An engine child of ``serve`` ends when serve has gone, however it went (SIGKILL included, on
    any system: Linux's parent-death signal is also set at its start, macOS has none)."""
    import os

    from localchat.processes import SERVE_PID, watch_parent

    serve = os.environ.get(SERVE_PID, "")
    if serve.isdigit():
        watch_parent(lambda: os._exit(1), also=int(serve))


if __name__ == "__main__":
    main()
