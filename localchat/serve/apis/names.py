"""The APIs the gateway serves, by the names ``--api`` takes (light: read by every ``--help``)."""

from __future__ import annotations

from localchat.errors import UsageError

APIS = ("anthropic", "responses")


def parse_apis(text: str | None) -> tuple[str, ...] | None:
    """``anthropic,responses`` → the APIs to serve, each once, in a fixed order."""
    if text is None:
        return None
    asked = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(asked - set(APIS))
    if unknown or not asked:
        raise UsageError(f"--api takes {' or '.join(APIS)} (comma-separated), not {', '.join(unknown) or repr(text)}")
    return tuple(api for api in APIS if api in asked)
