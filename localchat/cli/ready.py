"""A model made ready and loaded in this process for ``chat``: fetched when allowed and missing,
imported from its package on first use, judged against this machine's memory (``chat``'s fit
settings from its flags and runtime options), then loaded, behind one spinner from the first moment."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from localchat.cli.pull import fetch_missing
from localchat.fit.check import FitSettings, smaller_variants
from localchat.fit.verdict import summary
from localchat.registry import ModelRef, quantization_bits, resolve


def chat_fit(opts, options) -> FitSettings:
    """The fit settings of a chat: its flags and the model's runtime options (KV bits, size)."""
    from localchat.fit.estimate import KVSettings

    kv = KVSettings(bits=options.kv_bits, group_size=options.kv_group_size or 64, max_tokens=options.max_kv_size,
                    quantized_start=options.quantized_kv_start or 0)
    return FitSettings(memory_limit=opts.model.memory_limit, context=opts.trim.max_context_tokens, kv=kv,
                       force=opts.model.force)


def ready_model_dir(ref: ModelRef, settings: FitSettings, *, allow_download: bool, err: Console,
                    also: tuple[ModelRef, ...] = ()) -> Path:
    """The model's directory: fetched first when allowed and missing (``also``: a draft model),
    then judged against this machine's memory before anything loads."""
    from localchat.fit.check import check_local
    from localchat.registry import local_dir

    if allow_download:
        for needed in (ref, *also):
            fetch_missing(needed, settings, err)
    path = local_dir(ref)
    report = check_local(ref.id, path, settings, smaller_variants(ref))
    if report.verdict in ("tight", "does not fit"):  # (the latter only with --force)
        err.print("note: " + summary(ref.id, report), style="yellow", markup=False)
    return path


def open_inproc(ref: ModelRef, opts: Any, ui: Any, runtime: Any) -> Any:
    """Load the model in this process (fetched first with ``--allow-download``, checked against the
    machine's memory), behind a spinner."""
    if not opts.model.allow_download:
        os.environ["HF_HUB_OFFLINE"] = "1"  # read by huggingface_hub when mlx_lm first imports it
    started = time.perf_counter()
    with ui.err.status(f"Loading {ref.id} …") as status:  # (from the first moment: MLX's import takes seconds)
        from localchat.model_loader import load_inproc_or_vision

        options = runtime.check()
        drafts = (resolve(options.draft_model),) if options.draft_model else ()
        importing = ref.kind == "package-gguf" and not (Path(ref.location) / "config.json").is_file()
        if importing:
            status.update(f"importing {ref.id} from its package (its first use here) …")
        path = ready_model_dir(ref, chat_fit(opts, options), allow_download=opts.model.allow_download, err=ui.err,
                               also=drafts)
        if importing:
            ui.info(f"imported {ref.id} from its package into {path} ({time.perf_counter() - started:.1f}s)")
        status.update(f"Loading {ref.id} …")
        backend = load_inproc_or_vision(ref, path, cache_reuse=opts.model.cache_reuse, options=options)
    bits = quantization_bits(path)
    quant = f", {bits}-bit" if bits else ""
    group = backend.options.kv_group_size  # the user's, or the one that fits the model's heads
    chosen = f", groups of {group}" + (" (64 does not divide the head dimension)" if group != 64 else "")
    extras = [f"adapter {options.adapter_path}" if options.adapter_path else "",
              f"drafting with {options.draft_model} ({options.num_draft_tokens} a step)" if options.draft_model else "",
              f"KV cache {options.kv_bits}-bit from {options.quantized_kv_start} tokens"
              + (chosen if options.kv_group_size is None else "") if options.kv_bits else "",
              f"rotating KV cache of {options.max_kv_size} tokens" if options.max_kv_size else ""]
    extra = "".join(f"; {e}" for e in extras if e)
    ui.info(f"loaded {ref.id} ({ref.kind}{quant}) in {time.perf_counter() - started:.2f}s{extra}")
    return backend
