"""mlx_lm's own ``TextStateMachine``, for a client that must not import MLX.

The class (with its helper ``_build_trie``) is pure Python, but it lives in ``mlx_lm.generate``,
whose import brings MLX and transformers: seconds before an HTTP client sends a byte. So the two
definitions are read from the installed mlx_lm's source and run alone (no copy of them here, so
they are always the installed version's). When mlx_lm is imported already, or its source does not
hold them as expected, the module itself is used.
"""

from __future__ import annotations

import ast
import collections
import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

WANTED = ("_build_trie", "TextStateMachine")


@functools.cache
def text_state_machine() -> Any:
    """The ``TextStateMachine`` class of the installed mlx_lm."""
    if "mlx_lm.generate" in sys.modules:
        return sys.modules["mlx_lm.generate"].TextStateMachine
    try:
        return _from_source()
    except Exception:  # a layout this reading does not know: the module, MLX and all
        from mlx_lm.generate import TextStateMachine

        return TextStateMachine


def _from_source() -> Any:
    spec = importlib.util.find_spec("mlx_lm")  # (a top-level package's spec: nothing is imported)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("mlx_lm is not installed")
    source_path = Path(next(iter(spec.submodule_search_locations))) / "generate.py"
    tree = ast.parse(source_path.read_text(encoding="utf-8"), str(source_path))
    body: list[ast.stmt] = [
        node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in WANTED
    ]
    if sorted(getattr(node, "name", "") for node in body) != sorted(WANTED):
        raise ImportError("mlx_lm.generate no longer defines them both")
    namespace: dict[str, Any] = {"deque": collections.deque, "__name__": "mlx_lm.generate"}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(source_path), "exec"), namespace)  # noqa: S102
    return namespace["TextStateMachine"]
