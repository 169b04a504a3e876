"""mlx_lm.server with what a client asks enforced while decoding: ``response_format``,
``tool_choice``, and localchat's ``guided_regex``/``guided_choice``, under the same grammar mask
as in-process (``backends.masking``). ``python -m localchat.serve.engine.enforcing`` takes mlx_lm.server's
own arguments; ``localchat serve`` runs it (``serve --plain`` runs mlx_lm.server as it is).

Everything else is mlx_lm.server's own engine: its request handling, prompt cache, batching and
distributed ranks. The seam is the narrowest found in mlx-lm 0.32 (docs/structured-output.md):

- ``APIHandler.handle_completion``: the request's fields are read and checked here, before anything
  is generated (a format the grammar cannot compile is a 400 in OpenAI's error shape), and what is
  to be enforced rides on the ``CompletionRequest`` (plain data, so ranks receive it too).
- ``ResponseGenerator._tokenize``: with the prompt's ids and the tokenizer at hand, the reply's mask
  (``MaskedDecoding``) is made and kept on the request's ``GenerationArguments``.
- ``mlx_lm.server._make_sampler`` / ``_make_logits_processors``: the engine builds one sampler and one
  list of processors per request, in its batched path and its single one alike; the mask joins them.
- ``mlx_lm.server.run``: it accepts a handler class but does not pass it on; ours does.

``SEAM`` names them; ``check_seam`` refuses to start, naming what moved, on an mlx-lm that lacks one.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from localchat.serve.engine.hangup import HangupWatch
from localchat.serve.engine.requested import Enforcement, RequestRefused, enforcement_of

TESTED_MLX_LM = ("0.32.2",)
SEAM = ("mlx_lm.server._make_sampler(args, tokenizer)", "mlx_lm.server._make_logits_processors(args)",
        "mlx_lm.server.ResponseGenerator._tokenize(tokenizer, request, args)",
        "mlx_lm.server.APIHandler.handle_completion(request, stop_words)", "mlx_lm.server.run(host, port, provider)")
ENFORCED_HEADER = "X-Localchat-Enforced"


def check_seam(server: Any) -> None:
    """A clear refusal, naming the part, when this mlx-lm lacks a part of the seam."""
    import inspect

    parts = {"_make_sampler": server, "_make_logits_processors": server, "_tokenize": server.ResponseGenerator,
             "handle_completion": server.APIHandler, "_run_http_server": server}
    for name, owner in parts.items():
        if not callable(getattr(owner, name, None)):
            raise SystemExit(f"localchat serve: mlx_lm.server has no {name} (the seam the grammar mask uses moved; "
                             f"tested with mlx-lm {', '.join(TESTED_MLX_LM)}): run serve --plain")
    source = inspect.getsource(server.ResponseGenerator)
    for call in ("_make_sampler(args", "_make_logits_processors(args)"):
        if call not in source:
            raise SystemExit(f"localchat serve: mlx_lm.server's engine no longer calls {call}…) per request "
                             f"(tested with mlx-lm {', '.join(TESTED_MLX_LM)}): run serve --plain")


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
    check_seam(server)
    make_sampler, make_processors = server._make_sampler, server._make_logits_processors
    masks = _Masks()

    def sampler(args: Any, tokenizer: Any) -> Any:
        inner = make_sampler(args, tokenizer)
        made = getattr(args, "localchat_mask", None)
        return made[0].sampler(inner) if made and made[0] is not None else inner

    def processors(args: Any) -> list[Any]:
        made = getattr(args, "localchat_mask", None)
        extra = []
        if made:
            masked, banned = made
            extra = [p for p in (banned, EndOnDeadEnd(masked, tuple(masked.llg.eos_tokens)) if masked else None) if p]
        return [*make_processors(args), *extra]

    class Generator(server.ResponseGenerator):
        def generate(self, request, *args, **kwargs):
            context, response = super().generate(request, *args, **kwargs)
            request.localchat_context = context  # for the hangup watch: what stops this request
            return context, response

        def _tokenize(self, tokenizer, request, args):
            tokenized = super()._tokenize(tokenizer, request, args)
            enforcement = getattr(request, "localchat_enforcement", None)
            if enforcement is not None:
                args.localchat_mask = mask_for(enforcement, tokenizer, self.model_provider.model,
                                               list(tokenized[0]), masks)
            return tokenized

    class Handler(server.APIHandler):
        enforced: str | None = None

        def handle_completion(self, request, stop_words):
            self.enforced = None  # each request its own (were connections kept alive, a handler would serve several)
            try:
                enforcement = enforcement_of(self.body)
                self._check_calls(enforcement)
            except RequestRefused as exc:
                return self._refuse(exc)
            if enforcement is not None:
                request.localchat_enforcement = enforcement
                if enforcement.calls == "none":
                    request.tools = None  # no call can start: the template offers none
                self.enforced = enforcement.kind
            with HangupWatch(self.connection, lambda: getattr(request, "localchat_context", None)):
                try:
                    return super().handle_completion(request, stop_words)
                except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                    self.close_connection = True  # a client that hung up is a normal event: one line, no traceback
                    logging.warning("localchat: the client hung up mid-reply; its reply is no longer generated")
                    return None

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

        def _refuse(self, exc: RequestRefused) -> None:
            import json

            self._set_completion_headers(400)
            self.end_headers()
            self.wfile.write(json.dumps({"error": {"message": str(exc), "type": "invalid_request_error",
                                                   "param": exc.param, "code": None}}).encode())

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

        from localchat.serve.engine.prompt_disk import disk_tier, tiered

        group = mx.distributed.init()
        disk = disk_tier(model_provider.cli_args) if group.size() == 1 else None  # (ranks hold shards of it)
        cache = tiered(server.LRUPromptCache, disk)(model_provider.cli_args.prompt_cache_size)
        response_generator = Generator(model_provider, cache)
        if group.rank() == 0:
            server._run_http_server(host, port, response_generator, server_class, handler_class)
        else:
            response_generator.join()

    server._make_sampler, server._make_logits_processors, server.run = sampler, processors, run


def main() -> None:
    import mlx_lm.server as server

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
