"""Turns through the real demo model: what is sent, what is committed, KV-cache reuse."""

import io
import re
from collections.abc import Iterator

from rich.console import Console

from localchat.backends import GenerationParams, TextChunk
from localchat.backends.inproc import InProcessBackend
from localchat.cli.render import ChatUI
from localchat.cli.repl import Repl
from localchat.conversation.history import Conversation
from localchat.conversation.settings import TrimPolicy
from localchat.conversation.turn import ChatSession, TurnStatus
from localchat.errors import LocalchatError

SYSTEM = "You are a helpful assistant."
REMEMBER = "Remember the code harbor 17. Reply only OK."
RECALL = "What was the code? Reply with the code only."


def session(backend, use_history=True, system=SYSTEM, **params) -> ChatSession:
    return ChatSession(backend, Conversation(system), GenerationParams(**{"max_tokens": 32, **params}),
                       use_history=use_history)


def test_turn_two_receives_turn_one(demo_backend):
    chat = session(demo_backend)
    first = chat.ask(REMEMBER)
    assert (first.text, first.committed) == ("OK", True)
    second = chat.ask(RECALL)
    assert second.messages == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": REMEMBER},
        {"role": "assistant", "content": "OK"},
        {"role": "user", "content": RECALL},
    ]
    assert second.text == "harbor 17"
    assert len(chat.conversation.messages()) == 5


def test_no_history_keeps_turns_independent(demo_backend):
    chat = session(demo_backend, use_history=False)
    assert chat.ask(REMEMBER).text == "OK"
    second = chat.ask(RECALL)
    assert second.messages == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": RECALL}]
    assert second.text == "I don't know."
    assert chat.conversation.turns == []


def test_reply_cut_by_max_tokens_is_not_committed(demo_backend):
    chat = session(demo_backend, max_tokens=1)
    result = chat.ask(RECALL)
    assert result.stats.finish_reason == "length" and result.status is TurnStatus.CUT
    assert not result.committed and chat.conversation.turns == []


class FailingAfterFirstChunk:
    """Wraps the real backend; fails (or is interrupted) once the first text has streamed."""

    def __init__(self, backend: InProcessBackend, exc: BaseException):
        self.inner, self.exc = backend, exc
        self.name, self.model_id, self.template = backend.name, backend.model_id, backend.template

    def stream(self, messages, params) -> Iterator:
        for event in self.inner.stream(messages, params):
            yield event
            if isinstance(event, TextChunk) and event.text:
                raise self.exc

    def count_tokens(self, messages, think=None):
        return self.inner.count_tokens(messages, think)

    def context_length(self):
        return self.inner.context_length()

    def close(self):
        self.inner.close()


def test_failed_turn_is_not_committed(demo_backend):
    chat = session(demo_backend)
    chat.ask(REMEMBER)
    chat.backend = FailingAfterFirstChunk(demo_backend, LocalchatError("connection lost"))
    result = chat.ask(RECALL)
    assert result.status is TurnStatus.ERROR and result.error == "connection lost"
    assert result.text and not result.committed
    assert [t.user for t in chat.conversation.turns] == [REMEMBER]


def test_interrupted_turn_is_not_committed_and_the_cache_stays_sound(demo_backend):
    chat = session(demo_backend)
    chat.ask(REMEMBER)
    chat.backend = FailingAfterFirstChunk(demo_backend, KeyboardInterrupt())
    assert chat.ask(RECALL).status is TurnStatus.INTERRUPTED
    assert len(chat.conversation.turns) == 1
    chat.backend = demo_backend
    again = chat.ask(RECALL)
    assert again.text == "harbor 17" and again.stats.cached_tokens > 0


def test_kv_reuse_gives_token_identical_greedy_output(demo):
    model, tokenizer = demo
    turns = [REMEMBER, "How are you?", "Thanks", RECALL]
    outputs = {}
    for reuse in (True, False):
        backend = InProcessBackend(model, tokenizer, "demo", cache_reuse=reuse)
        chat = session(backend)
        outputs[reuse] = []
        for prompt in turns:
            result = chat.ask(prompt)
            outputs[reuse].append((result.text, backend.cached_ids, result.stats))
    for (text_r, ids_r, stats_r), (text_n, ids_n, stats_n) in zip(outputs[True], outputs[False]):
        assert text_r == text_n and ids_r == ids_n
        assert stats_r.prompt_tokens == stats_n.prompt_tokens
        assert stats_n.cached_tokens == 0
    reuse_stats = [s for _, _, s in outputs[True]]
    assert reuse_stats[0].cached_tokens == 0
    assert all(s.cached_tokens > 0 for s in reuse_stats[1:])
    for previous, current in zip(reuse_stats, reuse_stats[1:]):
        # what the cache held and the new prompt no longer shared is reported, never lost
        assert current.cached_tokens + current.cache_miss_tokens >= previous.prompt_tokens


def test_demo_replies_retokenize_exactly_so_the_whole_history_is_reused(demo):
    model, tokenizer = demo
    chat = session(InProcessBackend(model, tokenizer, "demo"))
    stats = [chat.ask(p).stats for p in [REMEMBER, "How are you?", "Thanks", RECALL]]
    for previous, current in zip(stats, stats[1:]):
        assert current.cache_miss_tokens == 0 and current.cached_tokens >= previous.prompt_tokens


def test_max_context_tokens_drops_whole_turns_and_reports_it(demo_backend):
    chat = session(demo_backend)
    chat.trim = TrimPolicy(max_context_tokens=80)
    for prompt in ["Hello", "How are you?", "Thanks", "Good morning"]:
        result = chat.ask(prompt)
        assert result.stats.prompt_tokens <= 80
    assert result.dropped_turns > 0
    roles = [m["role"] for m in result.messages]
    assert roles[0] == "system" and roles[1:] == ["user", "assistant"] * ((len(roles) - 2) // 2) + ["user"]


def run_repl(backend, lines: list[str]) -> str:
    err = io.StringIO()
    ui = ChatUI(out=io.StringIO(), err=Console(file=err, width=200))
    feed = iter(lines)
    Repl(session(backend), ui, read_line=lambda _: next(feed)).run()
    return err.getvalue() + ui.out.getvalue()


def test_repl_counts_as_in_seed_001(demo_backend):
    out = run_repl(demo_backend, [
        "第二章原定周五，现改为周六复习。现在安排在哪天？", "那原来是哪天？",
        "/history", "/preview 那原来是哪天？", "/history",
        "/reset", "/history", "/preview 那原来是哪天？", "/quit",
    ])
    assert "周六\n" in out and "周五\n" in out
    headers = [line.split(" (")[0].split(",")[0] for line in out.splitlines()
               if line.startswith(("history:", "preview:"))]
    assert headers == ["history: 5 messages", "preview: 6 messages", "history: 5 messages",
                       "history: 1 message", "preview: 2 messages"]


def test_repl_sends_nothing_for_empty_lines_and_unknown_commands(demo_backend):
    out = run_repl(demo_backend, ["", "   ", "/bogus", "/history", "/quit"])
    assert "unknown command /bogus" in out and "/preview TEXT" in out
    assert re.search(r"history: 1 message\b", out)
    assert "[TTFT" not in out  # no turn ran


def test_repl_reports_a_truncated_reply(demo_backend):
    err = io.StringIO()
    ui = ChatUI(out=io.StringIO(), err=Console(file=err, width=200))
    chat = session(demo_backend, max_tokens=1)
    feed = iter([RECALL, "/history", "/quit"])
    Repl(chat, ui, read_line=lambda _: next(feed)).run()
    assert "reply cut at max_tokens 1: not added to history (/set max_tokens N raises it)" in err.getvalue()
    assert re.search(r"history: 1 message\b", err.getvalue())
