"""Everything the chat shows: the streamed answer on stdout, reasoning, figures and notices on stderr.

The REPL and single-prompt mode call this UI; the session and backends never print. A thinking
model's reasoning never reaches stdout, so a pipe gets only the answer: on a terminal it is folded
into one line that counts while the model thinks, or streamed dim with ``--show-thinking``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.status import Status

from localchat.backends import Message, Progress
from localchat.cli.markdown import MarkdownStream
from localchat.cli.terminal import console, for_stream
from localchat.conversation.jsonmode import pretty
from localchat.conversation.result import Compaction, Listeners, TurnResult, TurnStatus
from localchat.conversation.stats import TurnStats
from localchat.store.saved_sessions import Saved
from localchat.wording import count

INDENT = 5  # "  1. ": where a message's text starts in /history and /preview
HELP_FOOTER = ('A line with only """ starts and ends multi-line input (a pasted block is one message on a terminal). '
               "Ctrl+C stops a reply (discarded); Ctrl+R searches what you typed before.")


def saved_line(saved: Saved, turns: int) -> str:
    """What ``/save`` (or leaving a resumed session) did, and how to continue."""
    cache = f" {saved.cache.describe()}" if saved.cache else ""
    return (f"{'updated' if saved.replaced else 'saved'} '{saved.name}' ({count(turns, 'turn')}){cache}; "
            f"continue later with: localchat chat --resume {saved.name}")


def _memory(gb: float | None) -> str | None:
    if gb is None:
        return None
    return f"peak {gb:.1f} GB" if gb >= 1 else f"peak {gb * 1024:.0f} MB"


def stats_line(stats: TurnStats) -> str:
    """One line of figures: ``[TTFT 0.42s · 41.2 tok/s · in 274 (cached 256) · out 52 · …]``; a
    turn that thought adds its time to the first answer token and its reasoning tokens after TTFT."""
    est = "~" if stats.estimated else ""
    cached = f" (cached {stats.cached_tokens})" if stats.cached_tokens else ""
    thought = [f"answer {stats.ttfa_s:.2f}s" if stats.ttfa_s is not None else "no answer",
               f"think {'~' if stats.reasoning_estimated else ''}{stats.reasoning_tokens}"] if stats.thought else []
    parts = [
        f"TTFT {stats.ttft_s:.2f}s" if stats.ttft_s is not None else "TTFT –",
        *thought,
        f"{stats.decode_tps:.1f} tok/s" if stats.decode_tps is not None else None,
        f"in {est}{stats.prompt_tokens}{cached}" if stats.prompt_tokens else None,
        f"out {est}{stats.completion_tokens}" if stats.completion_tokens else None,
        f"{stats.total_s:.2f}s",
        f"ctx {round(100 * stats.context_share)} %" if stats.context_share is not None else None,
        f"drafted {stats.draft_tokens}/{stats.completion_tokens}" if stats.draft_tokens is not None else None,
        "KV cache rebuilt" if stats.cache_rebuilt else None,
        _memory(stats.peak_memory_gb),
        f"dropped {stats.cache_miss_tokens} cached" if stats.cache_miss_tokens else None,
        "estimated counts" if stats.estimated else None,
    ]
    return "[" + " · ".join(p for p in parts if p) + "]"


def _failed_before_first_token(result: TurnResult) -> bool:
    """Such a turn has no figures worth a line (the error or notice already says what happened)."""
    return result.status in (TurnStatus.ERROR, TurnStatus.INTERRUPTED) and result.stats.ttft_s is None


class ChatUI:
    def __init__(self, out: TextIO | None = None, err: Console | None = None, show_stats: bool = True,
                 json_mode: bool = False, show_thinking: bool = False, markdown: bool = False):
        self.out = out or sys.stdout
        self.shown = for_stream(self.out)  # answer text: exact through a pipe, made harmless on a terminal
        # answers rendered as Markdown as they stream (a terminal only; never in JSON mode)
        self.markdown = MarkdownStream(console(self.out)) if markdown and not json_mode else None
        self.err = err or console(stderr=True, soft_wrap=True)
        self.show_stats = show_stats
        self.json_mode = json_mode  # stdout gets validated JSON only, pretty-printed, once complete
        self.show_thinking = show_thinking
        self._waiting: Status | None = None  # the spinner between Enter and the first token
        self._thinking = 0  # reasoning chunks shown (or counted) in this turn

    def listeners(self) -> Listeners:
        """The reply as it streams: the answer on stdout, reasoning and prefill progress on stderr.
        On a terminal a spinner runs from now until the first text (it is started after the turn's
        clock and stopped after the first text was timed, so TTFT is the same with or without it)."""
        if self.err.is_terminal and self._waiting is None:
            self._waiting = self.err.status("waiting for the first token…", spinner="dots")
            self._waiting.start()
        return Listeners(on_text=self.text, on_reasoning=self.reasoning, on_progress=self.progress)

    def _stop_waiting(self) -> None:
        if self._waiting is not None:
            self._waiting.stop()
            self._waiting = None

    def compaction(self, done: Compaction) -> None:
        """A compaction's outcome and its own figures (it is never free)."""
        if done.result is None or not done.ok:
            self.notice(f"compaction: {done.reason}; nothing changed"
                        + (" (the turn is trimmed instead where it must be)" if done.result else ""))
        else:
            lines = done.result.text.strip().splitlines()
            self.info(f"compacted {count(done.replaced, 'turn')} into notes ({count(len(lines), 'line')}; /history "
                      "shows them, /uncompact restores the turns):")
            for line in lines[:3]:
                self.err.print(f"  {line}", style="dim", markup=False, highlight=False)
            if len(lines) > 3:
                self.info(f"  … {len(lines) - 3} more")
        if done.result is not None and self.show_stats and done.result.stats.ttft_s is not None:
            self.err.print("compaction " + stats_line(done.result.stats), style="dim", markup=False)

    def text(self, chunk: str) -> None:
        """Streamed answer text, flushed as it comes (held back in JSON mode)."""
        self._stop_waiting()
        self._end_thinking()
        if self.json_mode:
            return
        if self.markdown is not None:
            self.markdown.feed(chunk)
            return
        self.out.write(self.shown(chunk))
        self.out.flush()

    def reasoning(self, chunk: str) -> None:
        """Reasoning, on stderr only: streamed dim with --show-thinking, else a counter on a terminal."""
        self._stop_waiting()
        self._thinking += 1
        if self.show_thinking:
            self.err.print(chunk, style="dim", end="", markup=False, highlight=False)
        elif self.err.is_terminal:
            self.err.file.write(f"\r\x1b[2K\x1b[2mthinking… {self._thinking}\x1b[0m")
            self.err.file.flush()

    def _end_thinking(self) -> None:
        """Close what the reasoning left on stderr: the dim block's line, or the counter."""
        if not self._thinking:
            return
        if self.show_thinking:
            self.err.print()
        elif self.err.is_terminal:
            self.err.file.write("\r\x1b[2K")
            self.err.file.flush()
        self._thinking = 0

    def progress(self, progress: Progress) -> None:
        """What the spinner says while a long prompt is prefilled (a terminal only)."""
        if self._waiting is not None and progress.total:
            left = max(0, progress.total - progress.processed)
            self._waiting.update(f"prefilling {left:,} of {progress.total:,} prompt tokens…")

    def end_turn(self, result: TurnResult, max_tokens: int) -> None:
        self._stop_waiting()
        self._end_thinking()
        if self.json_mode:
            self._json_reply(result)
        elif self.markdown is not None:
            self.markdown.close()
        elif result.text:
            self.out.write("\n")
            self.out.flush()
        status = result.status
        if status is TurnStatus.INTERRUPTED:
            self.notice("interrupted: the reply was discarded, history is unchanged")
        elif status is TurnStatus.ERROR:
            self.error(result.error or "the reply failed")
            if result.trace and os.environ.get("LOCALCHAT_DEBUG") == "1":
                self.err.print(result.trace, markup=False, highlight=False)
            if result.text:
                self.notice("the partial reply above is incomplete and was not added to history")
        elif status is TurnStatus.CUT:
            where = " inside its reasoning" if result.reasoning and not result.text else ""
            self.notice(f"reply cut at --max-tokens {max_tokens}{where}: not added to history "
                        "(raise --max-tokens)")
        elif status is TurnStatus.INVALID:
            self.error(f"invalid JSON reply, not added to history: {result.invalid}")
        elif status is TurnStatus.UNRENDERABLE:
            self.error(f"the reply above was not added to history: {result.error}")
        elif status is TurnStatus.EMPTY:
            self.notice("the model reasoned but gave no answer: not added to history" if result.reasoning
                        else "empty reply: not added to history")
        if result.dropped_turns:
            share = f" (down to {result.stats.context_share:.0%} of it)" if result.stats.context_share else ""
            self.notice(f"left the {count(result.dropped_turns, 'oldest turn')} out of this request to fit "
                        f"{result.trimmed_for}{share}")
        if self.show_stats and not _failed_before_first_token(result):
            self.err.print(stats_line(result.stats), style="dim", markup=False)

    def _json_reply(self, result: TurnResult) -> None:
        if result.accepted:
            self.out.write(pretty(result.answer) + "\n")
            self.out.flush()
        elif result.text:
            self.err.print(f"reply: {result.text}", markup=False, highlight=False)

    def notice(self, message: str) -> None:
        self.err.print(f"[yellow]{escape(message)}[/yellow]")

    def error(self, message: str) -> None:
        self.err.print(f"[red]error:[/red] {escape(message)}")

    def info(self, message: str) -> None:
        self.err.print(escape(message), style="dim")

    def messages(self, messages: list[Message], title: str) -> None:
        """Numbered messages; a message's later lines are indented under its first."""
        self.err.print(f"[bold]{escape(title)}[/bold]")
        for i, m in enumerate(messages, 1):
            first, *rest = m["content"].split("\n")
            content = "\n".join([first, *(" " * INDENT + line if line.strip() else "" for line in rest)])
            self.err.print(f"{i:>3}. [cyan]{escape(m['role'])}[/cyan]: {escape(content)}")

    def ledger(self, summary: dict[str, Any], last: TurnStats | None) -> None:
        def fmt(value: Any, spec: str) -> str:
            return "–" if value is None else format(value, spec)

        s = summary
        self.err.print(
            f"turns {s['turns']} · tokens in {s['tokens_in']} / out {s['tokens_out']} · "
            f"cached {fmt(s['cached_share'], '.0%')} · TTFT mean {fmt(s['ttft_mean_s'], '.2f')}s "
            f"median {fmt(s['ttft_median_s'], '.2f')}s · tok/s mean {fmt(s['decode_tps_mean'], '.1f')} "
            f"median {fmt(s['decode_tps_median'], '.1f')}", markup=False)
        if s.get("context_share_last") is not None:
            self.err.print(f"context: last prompt {s['context_share_last']:.0%} of its budget, at most "
                           f"{s['context_share_max']:.0%}", markup=False)
        if s.get("compactions"):
            self.err.print(f"compactions {s['compactions']} · their tokens {s['compaction_tokens']} · their time "
                           f"{s['compaction_s']:.2f}s (counted in the figures above)", markup=False)
        if s.get("draft_share") is not None:
            self.err.print(f"speculative decoding: {s['draft_tokens']} of the generated tokens came from the draft "
                           f"model and were kept ({s['draft_share']:.0%})", markup=False)
        if s.get("reasoning_tokens"):
            est = "~" if s["reasoning_estimated"] else ""
            self.err.print(f"reasoning tokens {est}{s['reasoning_tokens']} · time to first answer token median "
                           f"{fmt(s['ttfa_median_s'], '.2f')}s (turns that thought)", markup=False)
        if last and last.runtime:
            figures = " · ".join(f"{k} {v:.1f}" for k, v in last.runtime.items())
            self.err.print(f"last turn, as the runtime reports it: {figures}", style="dim", markup=False)

    def help(self, commands: list[tuple[str, str]]) -> None:
        """The REPL's commands, one a line, then how input works."""
        width = max(len(usage) for usage, _ in commands)
        self.err.print("Commands (typed alone on a line):", markup=False)
        for usage, summary in commands:
            self.err.print(f"  {usage:<{width}}  {summary}", markup=False, highlight=False)
        self.err.print(HELP_FOOTER, markup=False, highlight=False)
