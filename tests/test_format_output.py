"""Answers in a format are output like any answer: through the terminal sanitiser, as the JSON
they are (a root string quoted), checked strictly (no NaN) and with every keyword the grammar
enforces in-process (``format``) when a server sent them."""

from __future__ import annotations

import io
import json

from typer.testing import CliRunner

from fakeserver import FakeServer, Reply, delta, sse
from localchat.cli.app import app
from localchat.cli.render import ChatUI
from localchat.conversation.result import TurnResult, TurnStatus
from localchat.conversation.stats import TurnStats
from localchat.grammar.answer_formats import AnswerFormat, pretty

runner = CliRunner()
HOSTILE = "\x1b]0;owned\x07\x1b[2Jhi\x1b[5m"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def shown(answer, json_answers: bool) -> str:
    out = Terminal()
    ui = ChatUI(out=out, err=io.StringIO(), show_stats=False, json_mode=True, json_answers=json_answers)
    ui.end_turn(TurnResult(prompt="p", messages=[], text=str(answer), stats=TurnStats(), answer=answer,
                           status=TurnStatus.COMMITTED), 16)
    return out.getvalue()


def test_a_regex_or_choice_answer_on_a_terminal_goes_through_the_sanitiser():
    printed = shown(HOSTILE, json_answers=False)
    assert "\x1b" not in printed and "\x07" not in printed and "hi" in printed


def test_a_json_answer_that_is_a_string_is_printed_as_a_json_string():
    assert shown("}什什", json_answers=True) == '"}什什"\n'
    assert pretty("x") == '"x"' and pretty("x", as_json=False) == "x"


def test_nan_is_not_json_and_formats_are_checked():
    anything = AnswerFormat("i", {"type": "object"})
    assert anything.check('{"x": NaN}')[1].startswith("not JSON: NaN is not JSON")
    assert anything.check('{"x": Infinity}')[0] is None
    email = AnswerFormat("i", {"type": "object", "properties": {"e": {"type": "string", "format": "email"}}})
    assert email.check('{"e": "not an email"}')[1] == "schema: e: 'not an email' is not a 'email'"
    assert email.check('{"e": "ada@example.com"}') == ({"e": "ada@example.com"}, None)
    assert AnswerFormat("i", {"type": "string"}).check("just a string")[1].startswith("not JSON")


def test_a_server_s_reply_that_breaks_its_format_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    schema = tmp_path / "contact.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"e": {"type": "string", "format": "email"}},
                                  "required": ["e"]}))
    for reply in ('{"e": "not an email"}', '{"e": NaN}'):
        fake = FakeServer()
        fake.chat(Reply(chunks=sse(delta(reply, "stop"))))
        try:
            done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", fake.base_url, "--json-schema",
                                       str(schema), "Contact?"])
        finally:
            fake.close()
        assert done.exit_code == 1 and done.stdout == "" and "invalid JSON reply" in done.stderr, done.stderr
