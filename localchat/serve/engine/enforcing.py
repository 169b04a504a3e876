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
  (``MaskedDecoding``) is made and kept by the request's generation arguments (``ByIdentity``).
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
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from localchat.processes import SERVED_ID
from localchat.serve.engine import seam
from localchat.serve.engine.cache_breaks import HEADER as CACHE_HEADER
from localchat.serve.engine.cache_breaks import LastBreak, Outcomes, located, log_line
from localchat.serve.engine.figures import EngineFigures
from localchat.serve.engine.hangup import HangupWatch
from localchat.serve.engine.kv_caches import KVLedger
from localchat.serve.engine.reply_masks import ByIdentity, EndOnDeadEnd, TokenizerGrammars, mask_for
from localchat.serve.engine.requested import (
    Enforcement,
    RequestRefused,
    enforced_request,
    enforcement_of,
    think_budget_of,
)
from localchat.serve.engine.think_budgets import ReplyBudgets, default_budget

ENFORCED_HEADER = "X-Localchat-Enforced"
KV_PATH = "/localchat/kv"  # the bits and the bytes of the engine's KV caches (``kv_caches``), for ``ps``
METRICS_PATH = "/metrics"  # the engine's own figures (``figures``), scraped by the front
KV_SETTINGS = ("kv_bits", "kv_group_size", "quantized_kv_start")


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


def install(server: Any) -> None:
    """Add the mask to mlx_lm.server's engine through the seam (in this process only)."""
    make_sampler, make_processors = server._make_sampler, server._make_logits_processors
    masks, replies, contexts, windows = TokenizerGrammars(), ByIdentity(), Contexts(), Windows()
    ledger, outcomes, last_break, budgets = KVLedger(), Outcomes(), LastBreak(), ReplyBudgets()
    serve_budget = default_budget()  # serve --think-budget
    figures = EngineFigures(ledger.nbytes, ledger.batch_size, lambda: ledger.largest_batch)
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
        budget = budgets.for_args(args)
        return [*make_processors(args), *extra, *([budget] if budget is not None else [])]

    class Generator(server.ResponseGenerator):
        def generate(self, request, generation_args, progress_callback=None):
            taken = time.perf_counter()
            context, response = super().generate(request, generation_args, progress_callback)
            figures.queued.observe(time.perf_counter() - taken)  # (its context comes when it joins the batch)
            context.localchat_outcome = outcomes.take(context.prompt)  # (what its prefix cache came to)
            contexts.started(request, context)
            return context, figures.counted(response, taken)

        def _tokenize(self, tokenizer, request, args):
            tokenized = super()._tokenize(tokenizer, request, args)
            if isinstance(request, request_type) and request.enforcement is not None:
                model = self.model_provider.model
                replies.put(args, mask_for(request.enforcement, tokenizer, model, list(tokenized[0]), masks))
            if isinstance(request, request_type) and request.think_budget is not None:
                traits = masks.of(tokenizer, self.model_provider.model)[1]
                budgets.put(args, request, request.think_budget, traits.reasoning, tokenizer, list(tokenized[0]))
            return tokenized

    class Handler(server.APIHandler):
        enforced: str | None = None
        answering: Any = None  # the request being answered
        kv_report: Callable[[], bytes] | None = None  # ``GET /localchat/kv`` (set in ``run``)

        def handle_completion(self, request, stop_words):
            self.enforced = None  # each request its own (were connections kept alive, a handler would serve several)
            try:
                enforcement = enforcement_of(self.body)
                budget = think_budget_of(self.body, serve_budget)
                self._check_calls(enforcement)
                self._check_window(request)
            except RequestRefused as exc:
                return self._refuse(exc)
            if enforcement is not None or budget is not None:
                request = request_type(**vars(request), enforcement=enforcement, think_budget=budget)
            if enforcement is not None:
                if enforcement.calls == "none":
                    request.tools = None  # no call can start: the template offers none
                self.enforced = enforcement.kind
            self.answering = request  # (as the engine runs it: the enforced request, when one is)
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
            return budgets.reported(named(super().generate_response(*args, **kwargs), served_id), self.answering)

        def completion_usage_response(self, *args, **kwargs):
            return budgets.reported(named(super().completion_usage_response(*args, **kwargs), served_id),
                                    self.answering)

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
            if self.path == METRICS_PATH:
                return self._answer(figures.text(), "text/plain; version=0.0.4; charset=utf-8")
            if self.path != KV_PATH or self.kv_report is None:
                return super().do_GET()
            return self._answer(self.kv_report(), "application/json")

        def _answer(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _set_completion_headers(self, status_code: int = 200):
            super()._set_completion_headers(status_code)
            self._localchat_headers(status_code)

        def _set_stream_headers(self, status_code: int = 200):
            super()._set_stream_headers(status_code)
            self._localchat_headers(status_code)

        def _localchat_headers(self, status_code: int) -> None:
            if status_code != 200:
                return
            if self.enforced:
                self.send_header(ENFORCED_HEADER, self.enforced)
            context = contexts.of(self.answering) if self.answering is not None else None
            outcome = getattr(context, "localchat_outcome", None)
            if context is None or outcome is None:
                return
            tokenizer = self.response_generator.model_provider.tokenizer
            if outcome.broke is not None:
                messages = self.answering.messages if self.answering.request_type == "chat" else None
                outcome = replace(outcome, broke=located(outcome.broke, tokenizer, messages, self.answering.tools))
                logging.warning(log_line(outcome, tokenizer, len(context.prompt)))
                last_break.noted(outcome.broke)
            figures.prompt(len(context.prompt), outcome)
            self.send_header(CACHE_HEADER, outcome.header())

    def run(host: str, port: int, model_provider: Any, server_class=server.ThreadingHTTPServer,
            handler_class=Handler) -> None:
        import mlx.core as mx

        from localchat.serve.engine import kv_caches
        from localchat.serve.engine.prompt_disk import disk_tier, tiered

        group = mx.distributed.init()
        settings = {name: getattr(model_provider.cli_args, name, None) for name in KV_SETTINGS}
        quantization = kv_caches.install(server, model_provider.cli_args, ledger)
        handler_class.kv_report = staticmethod(lambda: kv_caches.report(quantization, ledger, last_break.shown()))
        disk = disk_tier(settings, quantization) if group.size() == 1 else None  # (ranks hold shards of it)
        cache = tiered(seam.cache_files().LRUPromptCache, disk, outcomes)(model_provider.cli_args.prompt_cache_size)
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
