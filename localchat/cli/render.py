"""Everything the chat shows: the streamed answer on stdout, reasoning, figures and notices on stderr.

The REPL and single-prompt mode call this UI; the session and backends never print. A thinking
model's reasoning never reaches stdout, so a pipe gets only the answer: on a terminal it is folded
into one line that counts while the model thinks, or streamed dim with ``--show-thinking``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.status import Status

from localchat.backends import Message, PrefillProgress, ToolCall
from localchat.cli.markdown import MarkdownStream
from localchat.cli.terminal import console, for_stream
from localchat.conversation.result import Compaction, Listeners, TurnResult, TurnStatus
from localchat.conversation.stats import TurnStats, stats_line
from localchat.grammar.answer_formats import pretty
from localchat.vision.image import shown_text
from localchat.wording import count

INDENT = 5  # "  1. ": where a message's text starts in /history and /preview
HELP_FOOTER = ('A line with only """ starts and ends multi-line input (a pasted block is one message on a terminal). '
               "Ctrl+C stops a reply (discarded); Ctrl+R searches what you typed before.")


def shortened(value: Any, width: int = 200) -> str:
    """A call's arguments or a tool's result on one line of at most ``width`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _failed_before_first_token(result: TurnResult) -> bool:
    """Such a turn has no figures worth a line (the error or notice already says what happened)."""
    return result.status in (TurnStatus.ERROR, TurnStatus.INTERRUPTED) and result.stats.ttft_s is None


class ChatUI:
    def __init__(self, out: TextIO | None = None, err: Console | None = None, show_stats: bool = True,
                 json_mode: bool = False, show_thinking: bool = False, markdown: bool = False,
                 hold_rounds: bool = False, json_answers: bool = True):
        self.out = out or sys.stdout
        self.shown = for_stream(self.out)  # answer text: exact through a pipe, made harmless on a terminal
        # answers rendered as Markdown as they stream (a terminal only; never in JSON mode)
        self.markdown = MarkdownStream(console(self.out)) if markdown and not json_mode else None
        self.err = err or console(stderr=True, soft_wrap=None)
        self.show_stats = show_stats
        self.json_mode = json_mode  # stdout gets validated answers only, printed once complete
        self.json_answers = json_answers  # they are JSON (--json, --json-schema), not --regex or --choice text
        self.show_thinking = show_thinking
        self._waiting: Status | None = None  # the spinner between Enter and the first token
        self._thinking = 0  # reasoning chunks shown (or counted) in this turn
        # with tools through a pipe, a round's text waits to learn whether it is the answer (stdout)
        # or what the model wrote beside its calls (stderr): a pipe gets the answer alone
        self.hold_rounds = hold_rounds
        self._round_text: list[str] = []
        self._wrote = False  # answer text of this round is on stdout
        self._rounds = 0
        self.in_repl = False  # the REPL sets it: hints name /set, not the command's flags

    def listeners(self) -> Listeners:
        """The reply as it streams: the answer on stdout, reasoning and prefill progress on stderr.
        On a terminal a spinner runs from now until the first text (it is started after the turn's
        clock and stopped after the first text was timed, so TTFT is the same with or without it)."""
        self._rounds = 0
        self._start_waiting()
        return Listeners(on_text=self.text, on_reasoning=self.reasoning, on_progress=self.progress,
                         on_tool_call=self.tool_call, on_tool_result=self.tool_result, on_round=self.tool_round,
                         on_notice=self.notice)

    def _start_waiting(self) -> None:
        if self.err.is_terminal and self._waiting is None:
            self._waiting = self.err.status("waiting for the first token…", spinner="dots")
            self._waiting.start()

    def stop_waiting(self) -> None:
        """The spinner stops (every way out of a turn passes here, errors before any call too)."""
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
        self.stop_waiting()
        self._end_thinking()
        if self.json_mode:
            return
        if self.hold_rounds:
            self._round_text.append(chunk)
            return
        self._wrote = True
        if self.markdown is not None:
            self.markdown.feed(chunk)
            return
        self.out.write(self.shown(chunk))
        self.out.flush()

    def _end_answer(self) -> None:
        """Close the answer text this round wrote (its Markdown block, or its line)."""
        if self.markdown is not None:
            self.markdown.close()
        elif self._wrote:
            self.out.write("\n")
            self.out.flush()
        self._wrote = False

    def tool_call(self, call: ToolCall) -> None:
        """A call the model asks for, on stderr as it arrives (before any approval)."""
        self.stop_waiting()
        self._end_thinking()
        self._end_answer()
        self.err.print(f"→ {shortened(call.name, 80) or '?'}({shortened(call.arguments)})", style="cyan", markup=False)

    def tool_round(self, result: TurnResult) -> None:
        """A round that ended in calls: what it wrote beside them, and its own figures."""
        self._rounds += 1
        aside, self._round_text = "".join(self._round_text).strip(), []
        if aside:
            self.info(aside)
        if self.show_stats and result.stats.ttft_s is not None:
            self.err.print(f"round {self._rounds} " + stats_line(result.stats), style="dim", markup=False)

    def tool_result(self, result: Any) -> None:
        """A call's result (``tools.runner.ToolResult``), then the spinner for the next round."""
        style = {"ok": "green", "refused": "yellow"}.get(result.status, "red")
        self.err.print(f"← {shortened(result.content)} ({result.seconds:.2f}s)", style=style, markup=False)
        if result.printed.strip():
            self.err.print(f"  {result.call.name} printed (not sent to the model): {shortened(result.printed, 300)}",
                           style="dim", markup=False)
        self._start_waiting()

    def reasoning(self, chunk: str) -> None:
        """Reasoning, on stderr only: streamed dim with --show-thinking, else a counter on a terminal."""
        self.stop_waiting()
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

    def progress(self, progress: PrefillProgress) -> None:
        """What the spinner says while a long prompt is prefilled (a terminal only)."""
        if self._waiting is not None and progress.total:
            left = max(0, progress.total - progress.processed)
            self._waiting.update(f"prefilling {left:,} of {progress.total:,} prompt tokens…")

    def end_turn(self, result: TurnResult, max_tokens: int) -> None:
        self.stop_waiting()
        self._end_thinking()
        if self.json_mode:
            self._json_reply(result)
        elif self._round_text:
            self.out.write(self.shown("".join(self._round_text)) + "\n")
            self.out.flush()
            self._round_text = []
        else:
            self._end_answer()
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
            self.notice(self._cut_line(result, max_tokens))
        elif status is TurnStatus.INVALID:
            kind = "JSON reply" if (result.invalid or "").startswith(("not JSON", "schema:")) else "reply"
            self.error(f"invalid {kind}, not added to history: {result.invalid}")
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
            tools = [f"rounds {len(result.steps) + 1}", f"tools {result.tool_s:.2f}s"] if result.steps else []
            self.err.print(stats_line(result.stats, [*tools, *result.notes]), style="dim", markup=False)
        elif result.notes:
            self.notice("; ".join(result.notes))

    def _cut_line(self, result: TurnResult, max_tokens: int) -> str:
        """Why a reply that did not stop was not kept: its length, a filter, or what the runtime said."""
        reason = result.stats.finish_reason
        where = " inside its reasoning" if result.reasoning and not result.text else ""
        if reason in ("length", None) and self.json_mode:
            return f"reply cut at max_tokens {max_tokens}{where} before its answer was complete: no valid answer in " \
                   "the format asked for, not added to history (raise " + \
                   ("/set max_tokens N)" if self.in_repl else "--max-tokens)")
        if reason in ("length", None):
            if self.in_repl:
                return (
                    f"reply cut at max_tokens {max_tokens}{where}: not added to history (/set max_tokens N raises it)"
                )
            return f"reply cut at --max-tokens {max_tokens}{where}: not added to history (raise --max-tokens)"
        if reason == "content_filter":
            return f"the server filtered the reply{where} (finish_reason content_filter): not added to history"
        return f"the reply ended with finish_reason {shortened(reason, 40)!r}{where}, not stop: not added to history"

    def _json_reply(self, result: TurnResult) -> None:
        if result.accepted:
            self.out.write(self.shown(pretty(result.answer, self.json_answers)) + "\n")  # a format admits ESC too
            self.out.flush()
        elif result.text:
            self.err.print(f"reply: {result.text}", markup=False, highlight=False)

    def notice(self, message: str) -> None:
        self.err.print(f"[yellow]{escape(message)}[/yellow]")

    def error(self, message: str) -> None:
        self.err.print(f"[red]error:[/red] {escape(message)}")

    def info(self, message: str) -> None:
        self.err.print(escape(message), style="dim")

    def item(self, message: str) -> None:
        """A line of a listing (``/tools``): indented, and its wrapped lines with it."""
        from rich.padding import Padding

        self.err.print(Padding(escape(message), (0, 0, 0, 2)), style="dim")

    def messages(self, messages: list[Message], title: str, labels: dict[str, str] | None = None) -> None:
        """Numbered messages; a message's later lines are indented under its first; an assistant's
        tool calls as ``→ name(arguments)``, a tool's result under the tool's name; a picture as its
        label (``labels``: data URL → label)."""
        self.err.print(f"[bold]{escape(title)}[/bold]")
        for i, m in enumerate(messages, 1):
            calls = [f"→ {c['function']['name']}({shortened(c['function']['arguments'], 300)})"
                     for c in m.get("tool_calls", [])]
            text = shown_text(m["content"], labels)
            first, *rest = "\n".join([*([text] if text or not calls else []), *calls]).split("\n")
            role = f"{m['role']} ({m['name']})" if m["role"] == "tool" and m.get("name") else m["role"]
            content = "\n".join([first, *(" " * INDENT + line if line.strip() else "" for line in rest)])
            self.err.print(f"{i:>3}. [cyan]{escape(role)}[/cyan]: {escape(content)}")

    def ledger(self, summary: dict[str, Any], last: TurnStats | None) -> None:
        def fmt(value: Any, spec: str, unit: str = "") -> str:
            return "–" if value is None else format(value, spec) + unit

        s = summary
        interrupted = f" ({s['interrupted']} more interrupted)" if s.get("interrupted") else ""
        self.err.print(
            f"turns {s['turns']}{interrupted} · tokens in {s['tokens_in']} / out {s['tokens_out']} · "
            f"cached {fmt(s['cached_share'], '.0%')} · TTFT mean {fmt(s['ttft_mean_s'], '.2f', 's')} "
            f"median {fmt(s['ttft_median_s'], '.2f', 's')} · tok/s mean {fmt(s['decode_tps_mean'], '.1f')} "
            f"median {fmt(s['decode_tps_median'], '.1f')}", markup=False)
        if s.get("context_share_last") is not None:
            self.err.print(f"context: last prompt {s['context_share_last']:.0%} of its budget, at most "
                           f"{s['context_share_max']:.0%}", markup=False)
        if s.get("compactions"):
            self.err.print(f"compactions {s['compactions']} · their tokens {s['compaction_tokens']} · their time "
                           f"{s['compaction_s']:.2f}s (counted in the figures above)", markup=False)
        if s.get("tool_calls"):
            self.err.print(f"tool rounds {s['tool_rounds']} · tool calls {s['tool_calls']} · time inside tools "
                           f"{s['tool_s']:.2f}s (apart from the model's time above)", markup=False)
        if s.get("mask_us_per_token") is not None:
            self.err.print(f"grammar mask: {s['mask_us_per_token']:.0f} µs a token over {s['masked_tokens']} masked "
                           "decoding steps (part of the decode time above)", markup=False)
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
        from rich.table import Table

        self.err.print("Commands (typed alone on a line):", markup=False)
        rows = Table.grid(padding=(0, 2), pad_edge=True)  # a summary that wraps stays in its column
        rows.add_column(no_wrap=True)
        rows.add_column()
        for usage, summary in commands:
            rows.add_row(usage, summary)
        self.err.print(rows)
        self.err.print(HELP_FOOTER, markup=False, highlight=False)
