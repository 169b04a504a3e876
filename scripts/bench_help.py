"""How long ``localchat --help`` takes, and what it loads.

    uv run python scripts/bench_help.py [--runs 5]

Runs ``localchat --help`` (the installed entry point, a new process each time) and a bare
``python -c pass`` alternately, and prints the median of each, their difference (what localchat's
start costs) and the modules of localchat, MLX, Rich and httpx that the top-level command
imports. Target: median ≤ 0.25 s. Only the subcommand that runs imports its own modules.
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
          "('localchat', 'mlx', 'rich', 'httpx', 'prompt_toolkit', 'yaml')) and m.count('.') < 3)))")


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    timed([str(ENTRY), "--help"])  # warm the file cache once
    helps, bares = [], []
    for _ in range(args.runs):
        helps.append(timed([str(ENTRY), "--help"]))
        bares.append(timed([sys.executable, "-c", "pass"]))
    median, bare = statistics.median(helps), statistics.median(bares)
    env = collect()
    print(f"localchat --help: median {median:.3f} s of {args.runs} (min {min(helps):.3f}, max {max(helps):.3f}); "
          f"bare python {bare:.3f} s; localchat's own start {median - bare:.3f} s")
    print(f"target ≤ {TARGET_S:.2f} s: {'met' if median <= TARGET_S else 'NOT met'}")
    loaded = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, check=True).stdout
    print(f"imported by the top-level command: {loaded.strip()}")
    print(f"measured on {env.hardware_label}, Python {env.python}")


if __name__ == "__main__":
    main()
