"""``bench --distance 0,2,4,8,16``: recall by distance. A built-in script family states a fact (a
code), then k small-talk turns, then asks for it, for each k; through every arm (``--policy``
arms too), accuracy against distance with intervals shows where each history policy forgets.
"""

from __future__ import annotations

from typing import Any

from localchat.bench.script import BenchScript, ScriptTurn
from localchat.bench.uncertainty import clusters
from localchat.errors import UsageError
from localchat.intervals import cluster_mean

PREFIX = "distance-"
MAX_DISTANCE = 64
SMALL_TALK = ("Hello", "How are you?", "What is your name?", "Nice weather today.", "Tell me a joke.", "Thanks",
              "Good morning", "What can you do?", "Are you a real assistant?", "What time is it?", "Hi", "Goodbye")


def parse_distances(text: str) -> tuple[int, ...]:
    try:
        distances = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise UsageError(f"--distance takes numbers of turns separated by commas (0,2,4,8), not {text!r}") from None
    if not distances or distances[0] < 0 or distances[-1] > MAX_DISTANCE:
        raise UsageError(f"--distance takes numbers of turns from 0 to {MAX_DISTANCE}")
    return distances


def distance_scripts(distances: tuple[int, ...]) -> list[BenchScript]:
    """One script a distance: the code told, k small-talk turns, the code asked for (scored as an
    early fact; the pin policy pins the code)."""
    scripts = []
    for k in distances:
        turns = (ScriptTurn("Remember the code {code}. Reply only OK.", expect="OK", pin="the code {code}"),
                 *(ScriptTurn(SMALL_TALK[i % len(SMALL_TALK)]) for i in range(k)),
                 ScriptTurn("What was the code? Reply with the code only.", expect="{code}", fact="early"))
        scripts.append(BenchScript(f"{PREFIX}{k}", f"built-in:{PREFIX}{k}", "You are a helpful assistant.",
                                   {"code": {"generate": "code", "script": "en"}}, (turns,)))
    return scripts


def distance_summary(turns: list[Any]) -> dict[str, list[dict]] | None:
    """Per arm, the recall's accuracy at each distance with its 95 % interval (over repeats)."""
    asked = [r for r in turns if r.script.startswith(PREFIX) and r.fact == "early"]
    if not asked:
        return None
    out: dict[str, list[dict]] = {}
    for arm in dict.fromkeys(r.arm for r in asked):
        rows = []
        for script in sorted({r.script for r in asked if r.arm == arm}, key=lambda s: int(s[len(PREFIX):])):
            mine = [r for r in asked if r.arm == arm and r.script == script]
            interval = cluster_mean(list(clusters(mine, lambda r: float(bool(r.correct))).values()), share=True)
            rows.append({"distance": int(script[len(PREFIX):]), "correct": sum(bool(r.correct) for r in mine),
                         "asked": len(mine), "accuracy": interval.as_dict()})
        out[arm] = rows
    return out
