"""The sampling settings a conversation runs with, chosen one way by ``chat`` and by the page: each
from what was given now (a flag), else from what the conversation was left with (``/set``, the
page's controls: kept with it, so a resumed conversation goes on as it was), else from the model's
defaults in models.yaml, else localchat's own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localchat.backends import GenerationParams
from localchat.errors import UsageError
from localchat.registry import ModelRef
from localchat.sampling import SETTINGS, check_setting

DEFAULT_MAX_TOKENS = 512
FALLBACKS: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                             "repetition_penalty": None, "max_tokens": DEFAULT_MAX_TOKENS}


def chosen_params(ref: ModelRef | None, given: Mapping[str, Any], kept: Mapping[str, Any] | None = None,
                  ) -> GenerationParams:
    """The settings of ``SETTINGS``, each from ``given``, else ``kept``, else ``ref``'s default, else
    localchat's (a kept value no longer valid, from another version or a damaged file, is passed over)."""
    def chosen(name: str) -> Any:
        for value in (given.get(name), kept_setting(kept, name)):
            if value is not None:
                return value
        return ref.default(name, FALLBACKS[name]) if ref else FALLBACKS[name]

    return GenerationParams(**{name: chosen(name) for name in SETTINGS})


def kept_setting(kept: Mapping[str, Any] | None, name: str) -> Any:
    """A conversation's kept setting, None when it kept none or one that is not valid."""
    if not kept or kept.get(name) is None:
        return None
    try:
        return check_setting(name, kept[name])
    except UsageError:
        return None
