"""Copies of the demo that differ in one setting, registered by name for a benchmark's own processes
(``LOCALCHAT_MODELS``, beside the shipped models): the weights are linked, not copied."""

from __future__ import annotations

import json
import os
from pathlib import Path

import localchat
from localchat.registry import local_dir, resolve


def register_demo_variants(home: Path, variants: dict[str, dict[str, dict]]) -> None:
    """Each ``name: {file: changes}`` (``config.json``, ``tokenizer_config.json``) as a copy of the
    demo in ``home``, registered as ``name`` for this process and what it starts."""
    source = local_dir(resolve("demo"))
    entries = ""
    for name, changes in variants.items():
        copy = home / name
        copy.mkdir(parents=True, exist_ok=True)
        for file in source.iterdir():
            if file.is_file() and file.name not in changes:
                (copy / file.name).unlink(missing_ok=True)
                (copy / file.name).symlink_to(file)
        for file_name, changed in changes.items():
            (copy / file_name).write_text(json.dumps(json.loads((source / file_name).read_text()) | changed))
        entries += f"\n  - id: {name}\n    source: {copy}\n    description: the demo, changed for a benchmark\n" \
                   "    family: demo\n"
    registry = home / "models.yaml"
    registry.write_text(Path(localchat.__file__).with_name("models.yaml").read_text() + entries)
    os.environ["LOCALCHAT_MODELS"] = str(registry)
