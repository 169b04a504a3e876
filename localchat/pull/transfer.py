"""Run a plan's download (``pull.fetch`` in its own process group) and show it: a Rich progress
bar (bytes, speed, time left) on a terminal, a plain line per file and per tenth otherwise.
Ctrl+C stops the download within a second: the process group is killed, the partial file it was
writing is removed, and the files that finished stay in the cache for the next pull."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import LocalchatError
from localchat.pull.plan import PullPlan, RemoteFile


@dataclass(frozen=True)
class Transfer:
    """What the download did: the files finished, the bytes that came, and why it ended."""

    finished: tuple[str, ...]
    received: int
    stopped_by: KeyboardInterrupt | None = None  # Ctrl+C or SIGTERM (its exit code is its own)


class DownloadTally:
    """Bytes so far across the files; the shown bar or lines are the caller's ``show``."""

    def __init__(self, plan: PullPlan, show: Callable[[int, str], None]) -> None:
        self.sizes = {f.name: f.size for f in plan.files}
        self.per_file: dict[str, int] = {}
        self.finished: list[str] = []
        self.show = show

    @property
    def received(self) -> int:
        return sum(self.per_file.values())

    def take(self, event: dict) -> str | None:
        """One line from the fetcher; an error's text is returned."""
        if "file" in event:
            self.per_file[event["file"]] = min(int(event["bytes"]), self.sizes.get(event["file"], 0))
            self.show(self.received, event["file"])
        elif "done" in event:
            self.per_file[event["done"]] = self.sizes.get(event["done"], 0)
            self.finished.append(event["done"])
            self.show(self.received, event["done"])
        elif "error" in event:
            return str(event["error"])
        return None


def _partials(plan: PullPlan) -> set[Path]:
    blobs = plan.cache_dir / f"models--{plan.repo.replace('/', '--')}" / "blobs"
    return set(blobs.glob("*.incomplete")) if blobs.is_dir() else set()


def _spec(plan: PullPlan, files: list[RemoteFile]) -> str:
    """What the fetcher reads on its standard input (a long listing would not fit a command line)."""
    return json.dumps({"repo": plan.repo, "revision": plan.revision, "files": [[f.name, f.sha256] for f in files]})


def download(plan: PullPlan, show: Callable[[int, str], None]) -> Transfer:
    """Fetch the plan's missing files; a failure is a LocalchatError naming it."""
    from localchat.processes import child_preexec, kill_group

    missing = [f for f in plan.files if not f.cached]
    before = _partials(plan)
    progress = DownloadTally(plan, show)
    process = subprocess.Popen([sys.executable, "-m", "localchat.pull.fetch"], stdout=subprocess.PIPE,
                               stdin=subprocess.PIPE, start_new_session=True, preexec_fn=child_preexec(), text=True)
    error = None
    assert process.stdin is not None and process.stdout is not None  # (both are pipes)
    try:
        process.stdin.write(_spec(plan, missing))
        process.stdin.close()
        for line in process.stdout:
            try:
                error = progress.take(json.loads(line)) or error
            except (ValueError, KeyError, TypeError):
                continue  # a stray line from a library is not progress
        process.wait()
    except KeyboardInterrupt as stop:
        kill_group(process)
        for partial in _partials(plan) - before:
            partial.unlink(missing_ok=True)
        return Transfer(finished=tuple(progress.finished), received=progress.received, stopped_by=stop)
    finally:
        if process.poll() is None:
            kill_group(process)
    if error is not None or process.returncode != 0:
        raise LocalchatError(error or f"the download stopped (exit {process.returncode})")
    return Transfer(finished=tuple(progress.finished), received=progress.received)


class PlainLines:
    """Progress in a pipe: a line at each tenth of the whole, with the speed so far."""

    def __init__(self, total: int, write: Callable[[str], None]) -> None:
        self.total = max(total, 1)
        self.write = write
        self.tenth = 0
        self.started = time.monotonic()

    def __call__(self, received: int, name: str) -> None:
        tenth = min(10, received * 10 // self.total)
        if tenth > self.tenth:
            self.tenth = tenth
            rate = received / max(time.monotonic() - self.started, 1e-3)
            self.write(f"  {tenth * 10}% ({received:,} of {self.total:,} bytes, {rate / 1e6:.1f} MB/s)")
