"""``localchat pull`` and ``localchat rm``: get a model that fits, and free its disk again.

The plan (repo, files, sizes, free disk, the fit) is shown before anything is fetched; a model
that cannot fit or a download larger than the free disk is refused there (``--force`` to go on).
"""

from __future__ import annotations

import sys

from rich.console import Console

from localchat.errors import LocalchatError, UsageError
from localchat.extras import install_hint
from localchat.fit.check import FitSettings, judge_shape, smaller_variants
from localchat.fit.verdict import summary
from localchat.pull.plan import PullPlan, endpoint, make_plan
from localchat.pull.transfer import PlainLines, Transfer, download
from localchat.registry import ModelRef, resolve
from localchat.sizes import shown_size
from localchat.wording import run_as


def hub_ref(model: str) -> ModelRef:
    ref = resolve(model)
    if ref.kind != "hub":
        raise UsageError(f"{model}: nothing to pull, {how_it_arrives(ref)}")
    return ref


def how_it_arrives(ref: ModelRef) -> str:
    """How a model that is not on the Hub comes to this machine, for ``pull`` and ``models``."""
    if ref.kind == "bundled":
        return "it comes with localchat"
    if ref.kind == "package-gguf":
        from localchat.gguf.package import extra_of, package_file

        dist = (ref.entry.source if ref.entry else "").removeprefix("gguf-package:").split("/")[0]
        try:
            package_file(ref.entry.source if ref.entry else "")
        except LocalchatError:
            return f"it is imported from the {dist} package on first use; {install_hint(extra_of(dist))}"
        return f"it is imported from the {dist} package on first use: {run_as()} chat -m {ref.id}"
    return f"it is the local directory {ref.location}"


SHOWN_FILES = 24  # a model's few dozen files one a line; a longer listing ends with a count


def show_plan(plan: PullPlan, name: str, console: Console) -> None:
    cached = sum(f.cached for f in plan.files)
    console.print(f"{plan.repo} at {plan.revision[:12]} from {endpoint()}", markup=False)
    console.print(f"  {len(plan.files)} files, {shown_size(plan.total)}" + (f" ({cached} already here; "
                  f"{shown_size(plan.to_fetch)} to fetch)" if cached else ""), markup=False)
    width = max(len(f.name) for f in plan.files[:SHOWN_FILES])
    for file in plan.files[:SHOWN_FILES]:
        where = "already here" if file.cached else "to fetch"
        console.print(f"    {file.name:<{width}}  {shown_size(file.size):>9}  {where}", markup=False)
    if len(plan.files) > SHOWN_FILES:
        console.print(f"    … and {len(plan.files) - SHOWN_FILES} more files", markup=False)
    console.print(f"  free disk {shown_size(plan.free_disk)} at {plan.cache_dir}", markup=False)
    if plan.fit is not None:
        console.print("  " + summary(name, plan.fit), markup=False)
        if plan.fit.capacity:
            console.print("  " + plan.fit.capacity, markup=False)


def refuse(plan: PullPlan, name: str, force: bool) -> None:
    if force:
        return
    if plan.to_fetch > plan.free_disk:
        raise LocalchatError(f"{plan.repo} needs {shown_size(plan.to_fetch)} of disk and {shown_size(plan.free_disk)} "
                             "is free at "
                             f"{plan.cache_dir} (--force to try anyway)")
    if plan.fit is not None and plan.fit.verdict == "does not fit":
        raise LocalchatError(summary(name, plan.fit) + " (--force to download anyway)")


def _bar(console: Console, total: int):
    """A Rich progress bar with bytes, speed and time left; its ``show`` and the live context."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=console, transient=False)
    task = progress.add_task("downloading", total=total)

    def show(received: int, name: str) -> None:
        progress.update(task, completed=received, description=name[-32:])

    return progress, show


def fetch(plan: PullPlan, err: Console) -> Transfer:
    missing = plan.to_fetch
    if err.is_terminal:
        progress, show = _bar(err, missing)
        with progress:
            return download(plan, show)
    return download(plan, PlainLines(missing, lambda line: err.print(line, markup=False)))


def pull_ref(ref: ModelRef, settings: FitSettings, *, err: Console, dry_run: bool = False) -> PullPlan:
    """Plan, show, refuse or download; what ``pull`` and ``chat --allow-download`` both run."""
    plan = make_plan(ref.location, lambda shape: judge_shape(shape, settings, smaller_variants(ref)))
    show_plan(plan, ref.id, err)
    refuse(plan, ref.id, settings.force)
    if dry_run or plan.to_fetch == 0:
        err.print("nothing to fetch: every file is in the cache" if not dry_run else "dry run: nothing fetched",
                  markup=False)
        return plan
    transfer = fetch(plan, err)
    if transfer.stopped_by is not None:
        err.print(f"stopped: {len(transfer.finished)} of {sum(not f.cached for f in plan.files)} files finished "
                  "and kept in the cache; run the same command to resume", markup=False)
        raise transfer.stopped_by
    err.print(f"fetched {shown_size(transfer.received)} into {plan.cache_dir}", markup=False)
    return plan


def run_pull(*, model: str, dry_run: bool, memory_limit: int | None, context: int | None, kv_bits: int | None,
             force: bool, err: Console) -> None:
    from localchat.fit.estimate import KVSettings

    ref = hub_ref(model)
    settings = FitSettings(memory_limit=memory_limit, context=context, kv=KVSettings(bits=kv_bits), force=force)
    pull_ref(ref, settings, err=err, dry_run=dry_run)
    if not dry_run:
        from localchat.registry import local_dir

        local_dir(ref)  # the snapshot is a loadable model directory
        sys.stdout.write(f"{run_as()} chat -m {ref.id if ref.entry else ref.location}\n")


def fetch_missing(ref: ModelRef, settings: FitSettings, err: Console) -> None:
    """``--allow-download``: a hub model not in the cache is pulled first (plan, verdict, progress)."""
    from localchat.registry import hub_snapshot

    if ref.kind == "hub" and hub_snapshot(ref.location) is None:
        pull_ref(ref, settings, err=err)
