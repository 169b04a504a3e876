"""A model made ready to load in this process: fetched when allowed and missing, then judged
against this machine's memory (``chat``'s fit settings from its flags and runtime options)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from localchat.cli.pull import fetch_missing
from localchat.fit.check import FitSettings, smaller_variants
from localchat.fit.verdict import summary
from localchat.registry import ModelRef


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
