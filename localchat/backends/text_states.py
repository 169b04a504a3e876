"""A reply's text told apart by its markers (reasoning, tool calls), as mlx_lm.server tells it apart:
our own small state machine, with mlx_lm's ``TextStateMachine``'s interface and behaviour (a test
holds the two to the same output on the same text, however it is cut into chunks).

Why our own: mlx_lm's class is pure Python but lives in ``mlx_lm.generate``, whose import brings
MLX and transformers, seconds before an HTTP client sends a byte. The matching is Aho–Corasick over
characters (a state's markers in one trie with failure links), so a marker split across chunks is
found, and text is let out only once it cannot be the start of one.

A state is ``(name, node, machine's states, held text)``; ``split`` consumes text and returns the
new state with one ``(state name, text)`` segment per state passed (markers removed). A marker whose
next state is ``None`` ends the matching: what follows is held, never split again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

Trie = dict[Any, Any]
MATCH, FAIL = "__match__", "__fail__"


def build_trie(markers: list[str] | tuple[str, ...]) -> Trie:
    """The markers' trie: each node a dict of next characters, with the marker that ends there (or
    the longest that ends in its failure chain) and its failure link."""
    root: Trie = {}
    for index, marker in enumerate(markers):
        node = root
        for char in marker:
            node = node.setdefault(char, {})
        if node is not root:
            node[MATCH] = (tuple(marker), index)
    waiting: deque[Trie] = deque()
    for key, child in root.items():
        if key != MATCH:
            child[FAIL] = root
            waiting.append(child)
    while waiting:
        node = waiting.popleft()
        for char, child in node.items():
            if char in (MATCH, FAIL):
                continue
            fail = node[FAIL]
            while char not in fail and fail is not root:
                fail = fail[FAIL]
            child[FAIL] = fail[char] if char in fail else root
            if MATCH not in child and MATCH in child[FAIL]:
                child[MATCH] = child[FAIL][MATCH]
            waiting.append(child)
    return root


class TextStateMachine:
    """``transitions``: state → [(marker, next state)]; a state not named there has no markers."""

    def __init__(self, transitions: Mapping[str, Sequence[tuple[str, str | None]]] | None = None):
        self._states: dict[str | None, tuple[Trie, list[str | None]]] = {}
        for state, edges in (transitions or {}).items():
            self._states[state] = (build_trie([marker for marker, _ in edges]), [target for _, target in edges])

    def make_state(self, initial: str = "normal") -> tuple:
        if initial not in self._states:
            self._states[initial] = (build_trie([]), [])
        return initial, self._states[initial][0], self._states, ""

    @staticmethod
    def split(state: tuple, text: str) -> tuple[tuple, list[tuple[str | None, str]]]:
        name, node, states, held = state
        looked_from, text = len(held), held + text
        trie = states[name][0]
        segments: list[tuple[str | None, str]] = []
        begin = safe = 0  # text[begin:safe] is the current state's, text[safe:] may start a marker
        for position in range(looked_from, len(text)):
            char = text[position]
            while char not in node and node is not trie:
                node = node[FAIL]
            node = node.get(char, node)
            match = node.get(MATCH)
            if match is not None:
                segments.append((name, text[begin:position + 1 - len(match[0])]))
                begin = safe = position + 1
                name = states[name][1][match[1]]
                if name is None:
                    segments.append((None, ""))
                    return (None, None, states, text[safe:]), segments
                trie = node = states[name][0]
            elif node is trie:
                safe = position + 1
        segments.append((name, text[begin:safe]))
        return (name, node, states, text[safe:]), segments

    @staticmethod
    def step(state: tuple, text: str) -> tuple[tuple, str, str | None]:
        state, segments = TextStateMachine.split(state, text)
        return state, "".join(part for _, part in segments), state[0]

    @staticmethod
    def flush(state: tuple) -> tuple[tuple, str, str | None]:
        """The held text let out (the reply ended by its length)."""
        name, _, states, held = state
        return (name, states[name][0] if name is not None else None, states, ""), held, name

    @staticmethod
    def discard(state: tuple) -> tuple[tuple, str | None]:
        """The held text dropped (the reply ended by itself)."""
        name, _, states, _ = state
        return (name, states[name][0] if name is not None else None, states, ""), name
