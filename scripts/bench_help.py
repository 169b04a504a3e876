"""How long every ``localchat … --help`` takes, and what the top-level one loads.

    uv run python scripts/bench_help.py [--runs 5]

Runs ``localchat --help`` and every subcommand's ``--help`` (the installed entry point, a new
process each time), alternating with a bare ``python -c pass``, and prints the median of each,
the bare start beside it, and the modules of localchat, MLX, Rich and httpx that the top-level
command imports. Target: every median ≤ 0.25 s. Only the subcommand that runs imports its own
modules; a help loads its declarations only.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from localchat.environment import collect

TARGET_S = 0.25
ENTRY = Path(sys.executable).with_name("localchat")
LOADED = ("import sys, localchat.cli.app; print(' '.join(sorted(m for m in sys.modules if m.startswith("
          "('localchat', 'mlx', 'rich', 'httpx', 'prompt_toolkit', 'yaml', 'pydantic')) and m.count('.') < 3)))")


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def commands() -> list[list[str]]:
    """``[]`` (the top level), then every command's words, from the app's own tree."""
    import typer

    from localchat.cli.app import app

    def walk(group, words):
        for name, command in group.commands.items():
            yield [*words, name]
            if hasattr(command, "commands"):
                yield from walk(command, [*words, name])

    return [[], *walk(typer.main.get_command(app), [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    timed([str(ENTRY), "--help"])  # warm the file cache once
    bares: list[float] = []
    rows = []
    for words in commands():
        helps = []
        for _ in range(args.runs):
            helps.append(timed([str(ENTRY), *words, "--help"]))
            bares.append(timed([sys.executable, "-c", "pass"]))
        rows.append((" ".join(["localchat", *words, "--help"]), statistics.median(helps), min(helps), max(helps)))
    width = max(len(r[0]) for r in rows)
    for name, median, low, high in rows:
        mark = "" if median <= TARGET_S else "  NOT met"
        print(f"{name:<{width}}  median {median:.3f} s (min {low:.3f}, max {high:.3f}){mark}")
    slowest = max(r[1] for r in rows)
    print(f"bare python: median {statistics.median(bares):.3f} s; slowest help {slowest:.3f} s; "
          f"target every median ≤ {TARGET_S:.2f} s: {'met' if slowest <= TARGET_S else 'NOT met'}")
    loaded = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, check=True).stdout
    print(f"imported by the top-level command: {loaded.strip()}")
    print(f"measured on {collect().hardware_label}, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
