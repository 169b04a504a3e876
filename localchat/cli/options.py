"""What the commands collect, in small groups passed whole and built by keyword.

The Typer declarations shared by several commands (``--model``, ``--base-url``, ``--api-key``)
are written once here; so are the groups a chat is run with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from localchat.backends import DEFAULT_BASE_URL
from localchat.conversation.turn import TrimPolicy

ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", envvar="LOCALCHAT_MODEL", show_default=False,
    help="models.yaml id or alias, a local MLX model directory, or a Hugging Face repo id "
         "[default: demo; with --backend server, the server's own model].")]
BaseUrlOpt = Annotated[str, typer.Option(envvar="LOCALCHAT_BASE_URL", help="OpenAI-compatible base URL.")]
ApiKeyOpt = Annotated[Optional[str], typer.Option(envvar="LOCALCHAT_API_KEY", show_default=False,
                                                  help="Bearer token for remote servers (never printed or recorded).")]


class Backend(str, Enum):
    inproc = "inproc"
    server = "server"


@dataclass(frozen=True)
class ModelOptions:
    """Which model, and where it runs."""

    model: str | None = None  # None: "demo" in-process, the server's own model over HTTP
    backend: str = "inproc"  # "inproc" | "server"
    base_url: str = DEFAULT_BASE_URL
    api_key: str | None = None
    allow_download: bool = False
    cache_reuse: bool = True


@dataclass(frozen=True)
class GenerationOptions:
    """Sampling as the user asked for it; None means the model's default from models.yaml."""

    system: str | None = None  # None: the model's default; "": no system message
    temperature: float | None = None
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class OutputOptions:
    stats: bool = True
    json_answer: bool = False
    json_schema: Path | None = None


@dataclass(frozen=True)
class StorageOptions:
    record: Path | None = None
    resume: str | None = None


@dataclass(frozen=True)
class ChatOptions:
    model: ModelOptions = field(default_factory=ModelOptions)
    generation: GenerationOptions = field(default_factory=GenerationOptions)
    history: bool = True
    trim: TrimPolicy = field(default_factory=TrimPolicy)
    output: OutputOptions = field(default_factory=OutputOptions)
    storage: StorageOptions = field(default_factory=StorageOptions)
