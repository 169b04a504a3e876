"""The model registry (``models.yaml``) and resolving ``--model`` to something loadable.

``--model`` takes an id or alias from the registry, a local directory, or a Hugging Face repo
id. Nothing is ever downloaded here: a repo id must already be in the local Hugging Face cache
(``localchat pull`` and ``--allow-download`` fetch it first, through ``localchat.pull``).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat import bounded_json
from localchat.errors import LocalchatError, UsageError
from localchat.files import read_text
from localchat.gguf.package import PACKAGE_GGUF_PREFIX, ensure_imported
from localchat.sampling import SETTINGS, check_setting
from localchat.wording import run_as
from localchat.yamlfile import read_yaml

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLED_PREFIX = "bundled:"
DEMO_MODEL = "demo"  # the bundled toy: the one model smoke and bench judge on its answers
DEFAULT_MODEL = DEMO_MODEL
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
ENTRY_FIELDS = {"id", "aliases", "source", "description", "family", "defaults", "chat_template_kwargs", "imported",
                "variants", "vision"}
DEFAULT_FIELDS: dict[str, tuple[type, ...]] = {
    "system": (str, type(None)), "temperature": (int, float), "top_p": (int, float), "top_k": (int,),
    "min_p": (int, float), "repetition_penalty": (int, float), "max_tokens": (int,),
    # mlx_lm's load-time features, in-process (see backends.mlx_options)
    "adapter_path": (str,), "draft_model": (str,), "num_draft_tokens": (int,), "kv_bits": (int,),
    "kv_group_size": (int,), "quantized_kv_start": (int,), "max_kv_size": (int,)}


@dataclass(frozen=True)
class ModelEntry:
    id: str
    source: str
    description: str = ""
    family: str = ""  # the chat-template family (tests/test_families.py checks every one listed here)
    aliases: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    imported: dict[str, Any] | None = None  # what `localchat import` recorded: file, bits, types
    variants: dict[str, str] = field(default_factory=dict)  # NAME@variant → another quantization's repo
    vision: bool = False  # a vision-language model: runs through mlx-vlm, takes pictures


@dataclass(frozen=True)
class ModelRef:
    """A model resolved to a location: a local directory or a Hugging Face repo id."""

    id: str
    location: str
    kind: str  # "bundled" | "local" | "hub" | "package-gguf" (a GGUF in an installed package)
    entry: ModelEntry | None = None

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        return dict(self.entry.chat_template_kwargs) if self.entry else {}

    def default(self, name: str, fallback: Any = None) -> Any:
        return self.entry.defaults.get(name, fallback) if self.entry else fallback


def models_file() -> Path:
    """``LOCALCHAT_MODELS`` if set; else the ``models.yaml`` shipped in the package."""
    if env := os.environ.get("LOCALCHAT_MODELS"):
        return Path(env)
    return PACKAGE_DIR / "models.yaml"


def _fail(path: Path, where: str, message: str) -> LocalchatError:
    return LocalchatError(f"{path.name}: {where}: {message}")


def _parse_entry(raw: Any, index: int, path: Path) -> ModelEntry:
    where = f"entry {index}"
    if not isinstance(raw, dict):
        raise _fail(path, where, "must be a mapping with id, source, ...")
    if isinstance(raw.get("id"), str):
        where = f"entry {index} ({raw['id']})"
    for name in sorted(set(raw) - ENTRY_FIELDS):
        raise _fail(path, where, f"unknown field '{name}'")
    for name in ("id", "source"):
        if not isinstance(raw.get(name), str) or not raw[name].strip():
            raise _fail(path, where, f"field '{name}' must be a non-empty string")
    aliases = raw.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise _fail(path, where, "field 'aliases' must be a list of strings")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise _fail(path, where, "field 'defaults' must be a mapping")
    for key, value in defaults.items():
        if key not in DEFAULT_FIELDS:
            raise _fail(path, where, f"unknown field 'defaults.{key}'")
        if not isinstance(value, DEFAULT_FIELDS[key]) or isinstance(value, bool):
            raise _fail(path, where, f"field 'defaults.{key}' has the wrong type ({value!r})")
        if key in SETTINGS:
            try:
                check_setting(key, value)
            except UsageError as exc:
                raise _fail(path, where, f"defaults: {exc}") from None
    kwargs = raw.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _fail(path, where, "field 'chat_template_kwargs' must be a mapping")
    for name in ("description", "family"):
        if not isinstance(raw.get(name, ""), str):
            raise _fail(path, where, f"field '{name}' must be a string")
    imported = raw.get("imported")
    if imported is not None and not isinstance(imported, dict):
        raise _fail(path, where, "field 'imported' must be a mapping")
    variants = raw.get("variants") or {}
    if not isinstance(variants, dict) or not all(isinstance(k, str) and isinstance(v, str) and REPO_ID.match(v)
                                                 for k, v in variants.items()):
        raise _fail(path, where, "field 'variants' must map names to repo ids (8bit: org/name-8bit)")
    if not isinstance(raw.get("vision", False), bool):
        raise _fail(path, where, "field 'vision' must be true or false")
    return ModelEntry(id=raw["id"], source=raw["source"], description=raw.get("description", ""),
                      family=raw.get("family", ""), aliases=tuple(aliases),
                      defaults=defaults, chat_template_kwargs=kwargs, imported=imported, variants=variants,
                      vision=raw.get("vision", False))


def user_models_file() -> Path:
    """The user's own registry (``localchat import`` writes it), laid over models.yaml."""
    from localchat.home import home_dir

    return home_dir() / "models.yaml"


def read_registry_file(path: Path) -> list[ModelEntry]:
    data = read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise _fail(path, "top level", "expected a mapping with a 'models' list")
    return [_parse_entry(raw, i, path) for i, raw in enumerate(data["models"], 1)]


def load_registry(path: Path | None = None) -> list[ModelEntry]:
    """models.yaml, then the user's imported models; no name may mean two models."""
    entries = read_registry_file(path or models_file())
    user = user_models_file() if path is None else None
    if user is not None and user.is_file():
        entries += read_registry_file(user)
    seen: dict[str, str] = {}
    for entry in entries:
        for name in (entry.id, *entry.aliases):
            if name in seen:
                raise _fail(user or path or models_file(), f"entry ({entry.id})",
                            f"name '{name}' is already used by {seen[name]}")
            seen[name] = entry.id
    return entries


def _entry_location(entry: ModelEntry) -> tuple[str, str]:
    if entry.source.startswith(BUNDLED_PREFIX):
        return str(PACKAGE_DIR / entry.source[len(BUNDLED_PREFIX):]), "bundled"
    if entry.source.startswith(PACKAGE_GGUF_PREFIX):
        from localchat.home import home_dir

        return str(home_dir() / "models" / entry.id), "package-gguf"
    if REPO_ID.match(entry.source) and not Path(entry.source).expanduser().exists():
        return entry.source, "hub"
    return str(Path(entry.source).expanduser()), "local"


def resolve(name: str, entries: list[ModelEntry] | None = None) -> ModelRef:
    """An id, alias, local directory or repo id → a ModelRef (nothing is loaded or fetched)."""
    entries = load_registry() if entries is None else entries
    base, _, variant = name.partition("@")
    for entry in entries:
        if variant and (base == entry.id or base in entry.aliases):
            if variant not in entry.variants:
                listed = ", ".join(entry.variants) or "none are listed"
                raise UsageError(f"{entry.id} has no variant '{variant}' in models.yaml ({listed})")
            return ModelRef(f"{entry.id}@{variant}", entry.variants[variant], "hub", entry)
        if name == entry.id or name in entry.aliases:
            location, kind = _entry_location(entry)
            return ModelRef(entry.id, location, kind, entry)
    if not name.strip():
        raise UsageError("the model name is empty: a models.yaml id, a local directory or a repo id like org/name")
    path = Path(name).expanduser()
    if _exists(path) or name.startswith((".", "/", "~")):
        by_source = next((e for e in entries if Path(e.source).expanduser() == path), None)
        return ModelRef(name, str(path), "local", by_source)
    if REPO_ID.match(name):
        by_source = next((e for e in entries if e.source == name), None)
        return ModelRef(by_source.id if by_source else name, name, "hub", by_source)
    known = ", ".join(e.id for e in entries)
    shown = name if len(name) <= 80 else name[:80] + "…"
    raise UsageError(f"unknown model '{shown}': not in models.yaml ({known}), "
                     "not a local directory, not a repo id like org/name")


def _exists(path: Path) -> bool:
    """Whether a name is a path here; one the system cannot even look up (too long) is not."""
    try:
        return path.exists()
    except OSError:
        return False


def hub_snapshot(repo_id: str) -> Path | None:
    """The local snapshot of a repo in the Hugging Face cache, or None (never downloads)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def check_model_dir(path: Path, name: str) -> Path:
    if not path.exists():
        raise LocalchatError(f"model path {path} does not exist")
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise LocalchatError(f"{path} is not an MLX model directory (needs config.json and *.safetensors)")
    if not read_config(path):
        raise LocalchatError(f"{path / 'config.json'} is not a readable JSON object")
    for file in path.iterdir():
        if file.suffix in MODEL_FILE_SUFFIXES and not _regular(file):
            raise LocalchatError(f"{file} is not a regular file (a pipe, a device or a dangling link): "
                                 "remove it, or pull the model again")
    return path


MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".model", ".jinja", ".txt", ".tiktoken")


def _regular(path: Path) -> bool:
    """A file a loader can read to its end: a FIFO would block it forever, a device never end."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def local_dir(ref: ModelRef) -> Path:
    """The directory to load ``ref`` from; a hub model must be in the cache (``localchat pull``
    fetches it), a GGUF shipped in a package is imported the first time."""
    if ref.kind == "package-gguf":
        source = ref.entry.source if ref.entry else None
        return check_model_dir(ensure_imported(source, Path(ref.location)), ref.id)
    if ref.kind != "hub":
        return check_model_dir(Path(ref.location), ref.id)
    snapshot = hub_snapshot(ref.location)
    if snapshot is None:
        raise LocalchatError(f"{ref.location} is not in the local Hugging Face cache; fetch it with: "
                             f"{run_as()} pull {ref.id} (or rerun with --allow-download)")
    if not any(snapshot.glob("*.safetensors")):
        raise LocalchatError(f"{ref.location} is only partly in the Hugging Face cache (no weights yet); finish "
                             f"it with: {run_as()} pull {ref.id}")
    return check_model_dir(snapshot, ref.id)


@dataclass(frozen=True)
class ModelInfo:
    """What ``localchat models`` shows for one entry."""

    entry: ModelEntry
    present: bool
    size_bytes: int | None
    bits: int | None


def read_config(model_dir: Path) -> dict[str, Any]:
    """A model directory's ``config.json``; {} when it is missing, unreadable or not an object."""
    try:
        config = bounded_json.loads(read_text(model_dir / "config.json"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def quantization_bits(model_dir: Path) -> int | None:
    config = read_config(model_dir)
    quant = config.get("quantization") or config.get("quantization_config")
    bits = quant.get("bits") if isinstance(quant, dict) else None
    return bits if isinstance(bits, int) and not isinstance(bits, bool) else None


CONTEXT_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length", "n_ctx")


def positive(part: dict[str, Any], *names: str) -> int | None:
    """The first of ``names`` whose value in a config is a positive int (a JSON bool is not one)."""
    for name in names:
        value = part.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def context_length(config: dict[str, Any]) -> int | None:
    """The context window a model config declares (its text part, for multimodal configs)."""
    for part in (config, config.get("text_config")):
        if isinstance(part, dict) and (found := positive(part, *CONTEXT_KEYS)) is not None:
            return found
    return None


def context_length_of(ref: ModelRef) -> int | None:
    """``ref``'s context window from its config on this machine (never downloads); None if unknown."""
    path = hub_snapshot(ref.location) if ref.kind == "hub" else Path(ref.location)
    return context_length(read_config(path)) if path is not None else None


def directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def describe(entry: ModelEntry) -> ModelInfo:
    location, kind = _entry_location(entry)
    path = hub_snapshot(location) if kind == "hub" else Path(location)
    if path is None or not (path / "config.json").is_file():
        return ModelInfo(entry, False, None, None)
    return ModelInfo(entry, True, directory_size(path), quantization_bits(path))


def local_tokenizer_loader(ref: ModelRef | None) -> Callable[[], Any] | None:
    """Loads the model's tokenizer from this machine (for token estimates over HTTP), or None when
    the model is unknown or not here; nothing is loaded until it is called."""
    if ref is None or (ref.kind == "hub" and hub_snapshot(ref.location) is None):
        return None

    def load() -> Any:
        from mlx_lm.utils import load_tokenizer

        return load_tokenizer(local_dir(ref))

    return load
