"""Every REPL command with bad arguments: one line, and the REPL goes on with its history intact;
and the commands' effects on the history, through the history builder."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend
from localchat.cli.render import ChatUI
from localchat.cli.repl import REPL_COMMANDS, Repl
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession

REMEMBER = "Remember the code harbor 17. Reply only OK."
BAD = ["", " ", "x", "-1", "0", "99999999999999999999", "nan", "inf", "1e999", "²", "\x00", "é", '"', "'a b",
       "/dev/zero", "/", "~", "~nosuchuser/x", "a" * 9000, "temperature", "top_k 1.5", "max_tokens 0", "system",
       "min_p -0",
       "repetition_penalty 0", "1 2 3", "--help"]


def repl_with(demo, err: io.StringIO) -> Repl:
    model, tokenizer = demo
    session = ChatSession(InProcessBackend(model, tokenizer, "demo"), Conversation("You are a helpful assistant."),
                          GenerationParams(max_tokens=24))
    return Repl(session, ChatUI(out=io.StringIO(), err=Console(file=err, width=200)), read_line=input)


@pytest.mark.parametrize("command", [c for c in REPL_COMMANDS if c not in ("/quit", "/exit")])
def test_every_command_survives_bad_arguments(demo, command, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no clipboard tool: /copy must say so, not fail
    err = io.StringIO()
    repl = repl_with(demo, err)
    repl.handle(REMEMBER)
    for arg in BAD:
        assert repl.handle(f"{command} {arg}") is True
    assert "Traceback" not in err.getvalue()
    kept = repl.session.conversation.turns
    assert all(t.user and t.assistant for t in kept)  # nothing half-made entered the history
    if command == "/copy":
        assert "no clipboard tool found" in err.getvalue()


def test_retry_keeps_the_old_answer_when_the_new_one_is_not_accepted(demo):
    err = io.StringIO()
    repl = repl_with(demo, err)
    repl.handle(REMEMBER)
    before = list(repl.session.conversation.turns)
    repl.handle("/set max_tokens 1")  # "OK" and its end take two tokens: the retried reply is cut
    repl.handle("/retry")
    assert "reply cut at max_tokens 1: not added to history (/set max_tokens N raises it)" in err.getvalue()
    assert repl.session.conversation.turns == before
    repl.handle("/set max_tokens 24")
    repl.handle("/retry")
    assert [t.user for t in repl.session.conversation.turns] == [REMEMBER]  # replaced, not added


def test_set_changes_the_next_request_only_through_the_session(demo):
    err = io.StringIO()
    repl = repl_with(demo, err)
    repl.handle("/set system You are terse.")
    repl.handle("/set top_p 0.5")
    assert repl.session.preview("hi")[0] == {"role": "system", "content": "You are terse."}
    assert repl.session.params.top_p == 0.5
    repl.handle('/set system ""')
    assert repl.session.preview("hi") == [{"role": "user", "content": "hi"}]
    repl.handle("/set")
    assert "top_p 0.5" in err.getvalue() and "system none" in err.getvalue() and "None" not in err.getvalue()
