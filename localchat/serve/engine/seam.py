"""Every name of mlx_lm the engine uses beyond its documented API, in one list, checked when an
engine starts (and by a test): a newer mlx_lm that moved one refuses to start with one line that
names its version and the missing piece, never fails in the middle of a request.

The engine is mlx_lm.server's own (its request handling, prompt cache, batching and ranks) with
what localchat adds put in through these parts only (``enforcing``, ``prompt_disk``, ``hangup``,
``kv_caches``):

- a **function** or **method** is looked up and its parameters checked, in the order the engine
  passes them (it calls some positionally, and overrides others with the same parameters);
- a **class** is looked up (the engine subclasses it or hands it on);
- **fields** of a dataclass the engine reads (``CompletionRequest.tools``);
- a **source** part is text a function's source must hold: the engine relies on what that code
  does (``ResponseGenerator`` builds one sampler per request with ``_make_sampler(args``), which no
  signature shows.

Nothing else of mlx_lm's is touched outside this module's list; what an engine module imports from
mlx_lm it takes from ``server()`` and ``cache_files()`` here, after ``check()``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

TESTED_MLX_LM = "0.32.2"
SERVER = "mlx_lm.server"
CACHE = "mlx_lm.models.cache"
GENERATE = "mlx_lm.generate"
ATTENTION = "mlx_lm.models.base"


@dataclass(frozen=True)
class Part:
    """One name the engine relies on: ``where`` (a module) and ``name`` (dotted within it)."""

    where: str
    name: str
    params: tuple[str, ...] = ()  # the leading parameters (after ``self``), in this order
    fields: tuple[str, ...] = ()  # a dataclass's fields the engine reads
    holds: str = ""  # text the object's source must contain

    def shown(self) -> str:
        what = f"{self.where}.{self.name}"
        if self.params:
            return f"{what}({', '.join(self.params)})"
        if self.fields:
            return f"{what} with the field {', '.join(self.fields)}"
        if self.holds:
            return f"{what} calling {self.holds}…"
        return what


PARTS = (
    Part(SERVER, "_make_sampler", params=("args", "tokenizer")),
    Part(SERVER, "_make_logits_processors", params=("args",)),
    Part(SERVER, "_run_http_server", params=("host", "port", "response_generator", "server_class", "handler_class")),
    Part(SERVER, "run", params=("host", "port", "model_provider")),
    Part(SERVER, "main"),
    Part(SERVER, "ThreadingHTTPServer"),
    Part(SERVER, "ResponseGenerator", params=("model_provider", "prompt_cache")),
    Part(SERVER, "ResponseGenerator", holds="_make_sampler(args"),
    Part(SERVER, "ResponseGenerator", holds="_make_logits_processors(args)"),
    Part(SERVER, "ResponseGenerator.generate", params=("request", "generation_args", "progress_callback")),
    Part(SERVER, "ResponseGenerator._tokenize", params=("tokenizer", "request", "args")),
    Part(SERVER, "ModelProvider", holds="self.tokenizer ="),
    Part(SERVER, "ModelProvider", holds="self.cli_args ="),
    Part(SERVER, "APIHandler.handle_completion", params=("request", "stop_words")),
    Part(SERVER, "APIHandler.do_POST", holds="self.body ="),
    Part(SERVER, "APIHandler._set_completion_headers", params=("status_code",)),
    Part(SERVER, "APIHandler._set_stream_headers", params=("status_code",)),
    Part(SERVER, "APIHandler.generate_response", params=("text", "finish_reason")),
    Part(SERVER, "APIHandler.completion_usage_response",
         params=("prompt_token_count", "completion_token_count", "prompt_cache_count")),
    Part(SERVER, "CompletionRequest", fields=("tools",)),
    Part(SERVER, "GenerationContext.stop"),
    Part(CACHE, "LRUPromptCache", params=("max_size",)),
    Part(CACHE, "LRUPromptCache.fetch_nearest_cache", params=("model", "tokens")),
    Part(CACHE, "LRUPromptCache.insert_cache", params=("model", "tokens", "prompt_cache")),
    Part(CACHE, "load_prompt_cache", params=("file_name", "return_metadata")),
    Part(CACHE, "save_prompt_cache", params=("file_name", "cache", "metadata")),
    Part(CACHE, "can_trim_prompt_cache", params=("cache",)),
    Part(CACHE, "trim_prompt_cache", params=("cache", "num_tokens")),
    Part(CACHE, "KVCache.from_state"),
    # the KV caches (``kv_caches``, ``quantized_kv``): every cache the engine makes is ours
    Part(SERVER, "make_prompt_cache", params=("model",)),
    Part(GENERATE, "make_prompt_cache", params=("model", "max_kv_size")),
    Part(GENERATE, "BatchGenerator.insert_segments", holds="make_prompt_cache(self.model"),
    Part(SERVER, "ResponseGenerator._is_batchable", holds="kv_bits is None"),
    Part(SERVER, "APIHandler.do_GET"),
    Part(CACHE, "KVCache.to_quantized", params=("group_size", "bits")),
    Part(CACHE, "QuantizedKVCache", params=("group_size", "bits")),
    Part(CACHE, "BatchKVCache", params=("left_padding",)),
    Part(CACHE, "BatchKVCache", holds="self._right_padding = None"),
    Part(CACHE, "BatchKVCache.merge", params=("caches",)),
    Part(CACHE, "dynamic_roll", params=("x", "shifts", "axis")),
    Part(ATTENTION, "scaled_dot_product_attention", holds='hasattr(cache, "bits")'),
    # where a prompt broke from its cache (``cache_breaks``), and the figures (``figures``)
    Part(CACHE, "LRUPromptCache", holds="self._trie = PromptTrie()"),
    Part(CACHE, "PromptTrie.search", params=("model", "tokens")),
    Part(SERVER, "GenerationContext", fields=("prompt", "prompt_cache_count")),
    Part(SERVER, "APIHandler.handle_completion", holds="self._set_stream_headers(200)"),
)


class SeamBroken(SystemExit):
    """The installed mlx_lm lacks a part the engine uses: one line, the engine does not start."""


def _looked_up(part: Part, modules: Callable[[str], ModuleType]) -> Any:
    found: Any = modules(part.where)
    for name in part.name.split("."):
        found = getattr(found, name)
    return found


def _parameters(found: Any) -> list[str]:
    target = found.__init__ if inspect.isclass(found) else found
    names = [p.name for p in inspect.signature(target).parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[1:] if names[:1] == ["self"] else names


def _source(found: Any) -> str:
    """A function's source, or a class's own functions' (each read from where its code says it
    starts: ``inspect.getsource`` of a class parses its whole module, ~50 ms at every engine start
    for each class part)."""
    if inspect.isclass(found):
        return "\n".join(inspect.getsource(f) for f in vars(found).values() if inspect.isfunction(f))
    return inspect.getsource(found)


def missing(part: Part, modules: Callable[[str], ModuleType] = importlib.import_module) -> str | None:
    """What of ``part`` the installed mlx_lm lacks (a few words), or None when it is all there."""
    try:
        found = _looked_up(part, modules)
    except (ImportError, AttributeError):
        return "it is not there"
    try:
        if part.params and _parameters(found)[:len(part.params)] != list(part.params):
            return f"it takes ({', '.join(_parameters(found))})"
        if part.fields and not (dataclasses.is_dataclass(found) and
                                set(part.fields) <= {f.name for f in dataclasses.fields(found)}):
            return "its fields differ"
        if part.holds and part.holds not in _source(found):
            return "it no longer does that"
    except (TypeError, ValueError, OSError):  # no signature, no source to read
        return "it cannot be read"
    if not (part.params or part.fields or part.holds) and not (callable(found) or inspect.isclass(found)):
        return "it is not callable"
    return None


def check(parts: tuple[Part, ...] = PARTS, modules: Callable[[str], ModuleType] = importlib.import_module) -> None:
    """``SeamBroken`` (one line) at the first part the installed mlx_lm lacks."""
    for part in parts:
        why = missing(part, modules)
        if why is not None:
            raise SeamBroken(f"localchat serve: the engine needs {part.shown()} from mlx-lm, and in the installed "
                             f"mlx-lm {installed_version()} {why} (tested with {TESTED_MLX_LM}): install mlx-lm "
                             f"{TESTED_MLX_LM}, or run serve --plain")


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlx-lm")
    except PackageNotFoundError:
        return "(none)"


def server() -> ModuleType:
    """``mlx_lm.server``, its parts checked."""
    check()
    return importlib.import_module(SERVER)


def cache_files() -> ModuleType:
    """``mlx_lm.models.cache``: the prompt cache's files (save, load, trim), its LRU and the KV caches."""
    return importlib.import_module(CACHE)


def generation() -> ModuleType:
    """``mlx_lm.generate``: where the batch makes a request's first cache."""
    return importlib.import_module(GENERATE)
