"""The fault corpus: bad input and faulty servers, each one clear line and the right exit code.

Every case asserts the exit code, exactly one ``error:`` line on stderr naming what happened, no
traceback, the API key canary nowhere, and that the user's saved sessions and turn records are
unchanged (or, for records, complete and valid JSON). Fake servers are real sockets on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest
from typer.testing import CliRunner

from fakeserver import GOOD, USAGE, FakeServer, Reply, delta, sse
from localchat.cli.app import app
from localchat.conversation.history import Turn
from localchat.conversation.stats import TurnStats
from localchat.store.saved_sessions import SavedSession, SessionStore

runner = CliRunner()
CANARY = "sk-CANARY-7f3a9c1e5b"


@pytest.fixture(scope="module")
def server():
    fake = FakeServer()
    yield fake
    fake.close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A user home with one saved session and a records directory, fingerprinted."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOCALCHAT_API_KEY", raising=False)
    store = SessionStore(tmp_path / "home" / "sessions.sqlite3")
    store.save(SavedSession(name="kept", uid="u1", model="demo", backend="inproc", system="SYS",
                            params={"temperature": 0.0},
                            turns=(Turn("hi", "Hi there!", TurnStats(prompt_tokens=3)),)))
    records = tmp_path / "records"
    records.mkdir()
    return {"db": store.path, "records": records, "digest": _digest(store.path), "tmp": tmp_path}


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check(result, code: int, needle: str, home=None) -> None:
    output = result.stdout + result.stderr
    assert result.exit_code == code, output
    assert "Traceback" not in output and "Error:" not in output
    assert CANARY not in output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert needle in errors[0], errors[0]
    if home is not None:
        assert _digest(home["db"]) == home["digest"]
        for record in home["records"].glob("*"):
            assert record.suffix == ".json" and CANARY not in record.read_text()
            json.loads(record.read_text())
        requests = {p.name.removesuffix("-request.json") for p in home["records"].glob("*-request.json")}
        responses = {p.name.removesuffix("-response.json") for p in home["records"].glob("*-response.json")}
        assert requests == responses  # every call that was made has its outcome recorded


def keepalives(counts, total=100) -> list[bytes]:
    return [f": keepalive {n}/{total}\n\n".encode() for n in counts]


# --- a server whose stream is wrong ---------------------------------------------------------------

STREAM_FAULTS = {
    "choices holds null": (Reply(chunks=sse({"choices": [None]})), "'choices[0]' is not an object"),
    "content is a number": (Reply(chunks=sse(delta(5))), "'choices[0].delta.content' is not text"),
    "usage is text": (Reply(chunks=sse(delta("x", "stop", usage="lots"))), "'usage' is not an object"),
    "usage is negative": (Reply(chunks=sse(delta("x", "stop", usage={"prompt_tokens": -3}))),
                          "'usage.prompt_tokens' is not a whole number"),
    "usage is fractional": (Reply(chunks=sse(delta("x", "stop", usage={"completion_tokens": 1.5}))),
                            "'usage.completion_tokens'"),
    "cached tokens is text": (Reply(chunks=sse(delta("x", "stop", usage={
        "prompt_tokens_details": {"cached_tokens": "9"}}))), "cached_tokens"),
    "choices is text": (Reply(chunks=sse({"choices": "x"})), "'choices' is not a list"),
    "delta is a list": (Reply(chunks=sse({"choices": [{"delta": [1]}]})), "'choices[0].delta' is not an object"),
    "finish reason is a number": (Reply(chunks=sse(delta("x", 7))), "'choices[0].finish_reason' is not text"),
    "payload is a list": (Reply(chunks=sse([1, 2])), "unexpected payload"),
    "payload is a string": (Reply(chunks=sse('data: "hi"\n\n')), "unexpected payload"),
    "data is not JSON": (Reply(chunks=sse(b"data: {oops\n\n")), "not JSON"),
    "error payload": (Reply(chunks=sse({"error": {"message": "model exploded"}})), "model exploded"),
    "error as a string": (Reply(chunks=sse({"error": "boom"})), "boom"),
    "cut before the finish": (Reply(chunks=[b'data: {"choices": [{"delta": {"content": "half"}}]}\n\n']),
                              "ended before the reply finished"),
    "empty 200": (Reply(chunks=[]), "ended before the reply finished"),
    "only [DONE]": (Reply(chunks=sse()), "ended before the reply finished"),
    "one JSON body, not a stream": (Reply(chunks=[b'{"choices": []}'], headers={"Content-Type": "application/json"}),
                                    "not a stream"),
    "HTTP 500 with HTML": (Reply(500, [b"<html>Internal trouble</html>"], {"Content-Type": "text/html"}),
                           "HTTP 500"),
    "HTTP 404 JSON error": (Reply(404, [b'{"error": "model x not found"}'], {"Content-Type": "application/json"}),
                            "model x not found"),
    "HTTP 401": (Reply(401, [b'{"error": {"message": "bad key"}}'], {"Content-Type": "application/json"}),
                 "bad key"),
    "HTTP 429": (Reply(429, [b"slow down"], {"Content-Type": "text/plain"}), "slow down"),
    "HTTP 503 empty": (Reply(503, []), "(empty body)"),
    "HTTP 500 detail body": (Reply(500, [b'{"detail": "CUDA exploded"}'], {"Content-Type": "application/json"}),
                             "CUDA exploded"),
    "keepalives that never advance": (Reply(chunks=keepalives([5] * 12), pause_s=0.25), "made no progress for 1s"),
    "comments that are not keepalives": (Reply(chunks=[b": ping\n\n"] * 12, pause_s=0.25), "made no progress"),
    "silence": (Reply(chunks=[b": hi\n\n"], pause_s=3.0), "sent nothing for 1s"),
    "bytes trickled with no newline": (Reply(chunks=[b"d"] * 14, pause_s=0.2), "made no progress"),
    "unparsable keepalive counts": (Reply(chunks=[b": keepalive x/y\n\n"] * 12, pause_s=0.25), "made no progress"),
    "reasoning is a number": (Reply(chunks=sse({"choices": [{"delta": {"reasoning": 3}}]})),
                              "'choices[0].delta.reasoning' is not text"),
    "reasoning_content is a list": (Reply(chunks=sse({"choices": [{"delta": {"reasoning_content": ["x"]}}]})),
                                    "'choices[0].delta.reasoning_content' is not text"),
    "cut inside the reasoning": (Reply(chunks=[b'data: {"choices": [{"delta": {"reasoning": "hmm"}}]}\n\n']),
                                 "ended before the reply finished"),
    "reasoning, then only comments": (Reply(chunks=[b'data: {"choices": [{"delta": {"reasoning": "hmm"}}]}\n\n']
                                            + [b": ping\n\n"] * 12, pause_s=0.25), "made no progress"),
}


@pytest.mark.parametrize("name", list(STREAM_FAULTS))
def test_a_faulty_stream_is_one_line_and_exit_1(server, home, name):
    reply, needle = STREAM_FAULTS[name]
    server.chat(reply)
    result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--timeout", "1",
                                 "--record", str(home["records"]), "hello"])
    check(result, 1, needle, home)


def test_keepalives_that_advance_are_progress(server, home):
    """Four keepalives 0.4 s apart outlast a 1 s timeout, but each one advances: the turn succeeds."""
    server.chat(Reply(chunks=keepalives([25, 50, 75, 100]) + GOOD, pause_s=0.4))
    result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--timeout", "1",
                                 "hello"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "Hi there\n"


def test_a_bad_chunk_does_not_end_the_repl_or_touch_history(server, home):
    server.chat(Reply(chunks=sse({"choices": [None]})))
    result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url],
                           input="hello\n/history\n/quit\n")
    assert result.exit_code == 0 and "Traceback" not in result.stderr
    assert "'choices[0]' is not an object" in result.stderr and "history: 0 messages" in result.stderr


# --- the API key never leaves ---------------------------------------------------------------------

@pytest.mark.parametrize("reply, code", [
    (Reply(500, [b"headers were: "], {"Content-Type": "text/plain"}, echo_headers=True), 1),
    (Reply(400, [], {"Content-Type": "application/json"}, echo_headers=True), 1),
    (Reply(chunks=sse(delta(f"your key is {CANARY}"), delta(".", "stop"), {"choices": [], "usage": USAGE})), 0),
])
def test_the_key_is_cut_out_of_whatever_a_server_echoes(server, home, reply, code):
    server.chat(reply)
    args = ["chat", "--backend", "server", "--base-url", server.base_url, "--api-key", CANARY,
            "--record", str(home["records"]), "hello"]
    for extra in ([], ["--json"]):
        result = runner.invoke(app, args[:-1] + extra + args[-1:])
        assert CANARY not in result.stdout + result.stderr
    assert result.exit_code in (0, 1) and "Traceback" not in result.stderr
    assert all(CANARY not in p.read_text() for p in home["records"].glob("*.json"))
    assert server.requests[-1][1]["Authorization"] == f"Bearer {CANARY}"  # it was sent, as a header only


def test_smoke_json_never_shows_the_key(server):
    server.replies["/health"] = Reply(500, [b"oops "], {"Content-Type": "text/plain"}, echo_headers=True)
    server.replies["/v1/models"] = Reply(200, [], {"Content-Type": "application/json"}, echo_headers=True)
    server.chat(Reply(500, [b""], {"Content-Type": "text/plain"}, echo_headers=True))
    result = runner.invoke(app, ["smoke", "--base-url", server.base_url, "--api-key", CANARY, "--json"])
    assert result.exit_code == 1 and CANARY not in result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert not report["ok"] and "HTTP 500" in report["checks"][0]["detail"]


def test_smoke_against_nothing_names_the_url_and_never_the_key():
    result = runner.invoke(app, ["smoke", "--base-url", "http://127.0.0.1:9/v1", "--api-key", CANARY, "--json"])
    assert result.exit_code == 1 and CANARY not in result.stdout + result.stderr
    checks = json.loads(result.stdout)["checks"]
    assert len(checks) == 1  # said once, not once a check
    assert "http://127.0.0.1:9/health" in checks[0]["detail"] and "nothing is listening" in checks[0]["detail"]


def test_smoke_reports_a_failed_stream_as_failed(server):
    server.replies["/health"] = Reply(200, [b'{"status": "ok"}'], {"Content-Type": "application/json"})
    server.chat(Reply(chunks=sse({"choices": [None]})))
    result = runner.invoke(app, ["smoke", "--base-url", server.base_url, "--json"])
    streaming = json.loads(result.stdout)["checks"][3]
    assert not streaming["ok"] and "usage reported" not in streaming["detail"]
    assert "'choices[0]' is not an object" in streaming["detail"]


# --- values the CLI must refuse before anything runs ----------------------------------------------

USAGE_FAULTS = {
    "seed below zero": (["chat", "--seed", "-1", "x"], "--seed"),
    "seed over 64 bits": (["chat", "--seed", str(2**64), "x"], "--seed"),
    "seed not a number": (["chat", "--seed", "abc", "x"], "--seed"),
    "temperature inf": (["chat", "--temperature", "inf", "x"], "finite"),
    "temperature nan": (["chat", "--temperature", "nan", "x"], "finite"),
    "temperature negative": (["chat", "--temperature", "-1", "x"], "finite"),
    "top-p zero": (["chat", "--top-p", "0", "x"], "(0, 1]"),
    "top-p over one": (["chat", "--top-p", "1.5", "x"], "(0, 1]"),
    "top-p nan": (["chat", "--top-p", "nan", "x"], "(0, 1]"),
    "max-tokens zero": (["chat", "--max-tokens", "0", "x"], "--max-tokens"),
    "max-turns negative": (["chat", "--max-turns", "-1", "x"], "--max-turns"),
    "max-context-tokens zero": (["chat", "--max-context-tokens", "0", "x"], "--max-context-tokens"),
    "max-input-chars zero": (["chat", "--max-input-chars", "0", "x"], "--max-input-chars"),
    "timeout zero": (["chat", "--timeout", "0", "x"], "--timeout"),
    "timeout inf": (["chat", "--timeout", "inf", "x"], "--timeout"),
    "base-url broken bracket": (["chat", "--backend", "server", "--base-url", "http://[::1/v1", "x"], "not a URL"),
    "base-url port too high": (["chat", "--backend", "server", "--base-url", "http://127.0.0.1:99999/v1", "x"],
                               "port 99999 is out of range"),
    "base-url without scheme": (["chat", "--backend", "server", "--base-url", "127.0.0.1:8080", "x"], "http://"),
    "base-url ftp": (["chat", "--backend", "server", "--base-url", "ftp://host/v1", "x"], "http://"),
    "base-url no host": (["chat", "--backend", "server", "--base-url", "http:///v1", "x"], "with a host"),
    "doctor base-url broken": (["doctor", "--base-url", "http://[::1/v1"], "not a URL"),
    "smoke base-url broken": (["smoke", "--base-url", "http://[::1/v1"], "not a URL"),
    "api key with a newline": (["chat", "--backend", "server", "--api-key", CANARY + "\nX-Evil: 1", "x"],
                               "printable ASCII"),
    "api key not ASCII": (["chat", "--backend", "server", "--api-key", CANARY + "é", "x"], "printable ASCII"),
    "api key with a space": (["chat", "--backend", "server", "--api-key", CANARY + " x", "x"], "printable ASCII"),
    "api key empty": (["chat", "--backend", "server", "--api-key", "", "x"], "printable ASCII"),
    "unknown option": (["chat", "--bogus"], "No such option"),
    "unknown command": (["chatt"], "No such command"),
    "json and json-schema": (["chat", "--json", "--json-schema", "s.json", "x"], "alternatives"),
    "json-schema missing": (["chat", "--json-schema", "/nonexistent/s.json", "x"], "cannot read"),
    "no-history with a prompt": (["chat", "--no-history", "x"], "--no-history is for the REPL"),
    "a REPL command as the prompt": (["chat", "/quit"], "/quit is a REPL command"),
    "another REPL command": (["chat", "/history"], "/history is a REPL command"),
    "the think command as the prompt": (["chat", "/think on"], "/think is a REPL command"),
    "think given a value": (["chat", "--think=yes", "x"], "--think"),
    "bench think maybe": (["bench", "--think", "maybe"], "--think"),
    "empty prompt": (["chat", ""], "empty input"),
    "blank prompt": (["chat", "   \n "], "empty input"),
    "prompt over the limit": (["chat", "--max-input-chars", "5", "123456"], "over the limit of 5"),
    "unknown model": (["chat", "-m", "nosuchmodel", "x"], "unknown model 'nosuchmodel'"),
    "resume with --system": (["chat", "--resume", "kept", "--system", "S", "x"], "leave out --system"),
    "serve port out of range": (["serve", "--port", "70000"], "--port"),
    "serve an unknown model": (["serve", "-m", "nosuchmodel"], "unknown model"),
    "bench repeat zero": (["bench", "--repeat", "0"], "--repeat"),
    "bench seed negative": (["bench", "--seed", "-5"], "--seed"),
    "bench temperature nan": (["bench", "--temperature", "nan"], "finite"),
    "bench base-url broken": (["bench", "--base-url", "http://[::1/v1"], "not a URL"),
    "sessions show without a name": (["sessions", "show"], "Missing argument"),
    "sessions export bad format": (["sessions", "export", "kept", "--format", "pdf"], "--format"),
    "cache-max-bytes not a size": (["chat", "--cache-max-bytes", "lots", "x"], "--cache-max-bytes"),
    "cache-max-bytes negative": (["chat", "--cache-max-bytes", "-1", "x"], "--cache-max-bytes"),
    "cache-max-bytes unknown unit": (["chat", "--cache-max-bytes", "4X", "x"], "--cache-max-bytes"),
}


@pytest.mark.parametrize("name", list(USAGE_FAULTS))
def test_bad_values_are_usage_errors(home, name):
    args, needle = USAGE_FAULTS[name]
    check(runner.invoke(app, args), 2, needle, home)


@pytest.mark.parametrize("args", [["chat", "--resume", "nope", "x"], ["bench", "--replay", "nope"],
                                  ["sessions", "show", "nope"], ["sessions", "rm", "nope"]])
def test_a_session_name_that_is_not_saved_is_a_failure_not_a_usage_error(home, args):
    check(runner.invoke(app, args), 1, "no saved session named 'nope'", home)


def test_stdin_that_is_not_utf8_is_a_usage_error(home):
    check(runner.invoke(app, ["chat", "-"], input=b"\xff\xfe bad"), 2, "not valid UTF-8", home)


@pytest.mark.parametrize("damage", [b"", b"\x00" * 8, b"not a cache at all", "dir"])
def test_a_damaged_kv_cache_is_one_line_and_the_resume_goes_on(home, damage):
    cache = home["db"].parent / "kv-cache" / "kept.safetensors"
    cache.parent.mkdir()
    cache.mkdir() if damage == "dir" else cache.write_bytes(damage)
    result = runner.invoke(app, ["chat", "--resume", "kept", "--no-log", "Hello"])  # the turn itself is not kept
    assert result.exit_code == 0 and "Traceback" not in result.stdout + result.stderr, result.stderr
    notices = [line for line in result.stderr.splitlines() if "KV cache" in line]
    assert len(notices) == 1 and ("not used: it is damaged" in notices[0] or "is not a regular file" in notices[0])
    assert _digest(home["db"]) == home["digest"]


def test_localchat_home_that_is_a_file_is_named(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "file"))
    check(runner.invoke(app, ["sessions", "list"]), 2, "is a file, not a directory")


# --- models and model directories -----------------------------------------------------------------

REGISTRY_FAULTS = {
    "temperature nan": ("models:\n  - {id: x, source: /tmp, defaults: {temperature: .nan}}\n", "finite"),
    "temperature inf": ("models:\n  - {id: x, source: /tmp, defaults: {temperature: .inf}}\n", "finite"),
    "temperature negative": ("models:\n  - {id: x, source: /tmp, defaults: {temperature: -1}}\n", "finite"),
    "max_tokens zero": ("models:\n  - {id: x, source: /tmp, defaults: {max_tokens: 0}}\n", "max_tokens"),
    "unknown field": ("models:\n  - {id: x, source: /tmp, colour: red}\n", "unknown field 'colour'"),
    "duplicate alias": ("models:\n  - {id: x, source: /a}\n  - {id: y, source: /b, aliases: [x]}\n",
                        "already used"),
    "not a mapping": ("- just a list\n", "'models' list"),
    "bad YAML": ("models: [unclosed\n", "line"),
    "aliases not a list": ("models:\n  - {id: x, source: /a, aliases: x}\n", "aliases"),
    "entry not a mapping": ("models:\n  - 42\n", "must be a mapping"),
    "empty id": ("models:\n  - {id: '', source: /a}\n", "'id'"),
}


@pytest.mark.parametrize("name", list(REGISTRY_FAULTS))
def test_a_broken_registry_is_one_line_naming_the_entry(tmp_path, monkeypatch, name):
    text, needle = REGISTRY_FAULTS[name]
    (tmp_path / "models.yaml").write_text(text)
    monkeypatch.setenv("LOCALCHAT_MODELS", str(tmp_path / "models.yaml"))
    check(runner.invoke(app, ["models"]), 1, needle)


@pytest.mark.parametrize("config", ["[1, 2]", "not json", '"a string"'])
def test_a_model_whose_config_is_not_an_object(tmp_path, monkeypatch, config):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(config)
    (model / "model.safetensors").write_bytes(b"")
    (tmp_path / "models.yaml").write_text(f"models:\n  - {{id: odd, source: {model}}}\n")
    monkeypatch.setenv("LOCALCHAT_MODELS", str(tmp_path / "models.yaml"))
    listed = runner.invoke(app, ["models"])
    assert listed.exit_code == 0 and listed.stdout.startswith("odd · present")
    check(runner.invoke(app, ["chat", "-m", "odd", "x"]), 1, "is not a readable JSON object")


def test_a_directory_that_is_not_a_model(tmp_path):
    check(runner.invoke(app, ["chat", "-m", str(tmp_path), "x"]), 1, "is not an MLX model directory")


# --- bench checks what it will write before it runs -----------------------------------------------

def test_bench_out_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    check(runner.invoke(app, ["bench", "--out", str(tmp_path / "f")]), 2, "is a file, not a directory")


def test_a_refused_bench_leaves_no_empty_out_directory(tmp_path):
    out = tmp_path / "new" / "out"
    check(runner.invoke(app, ["bench", "--out", str(out), "--plot", str(tmp_path / "no" / "x.png")]), 2,
          "does not exist")
    assert not (tmp_path / "new").exists()


def test_bench_plot_into_a_missing_directory(tmp_path):
    check(runner.invoke(app, ["bench", "--plot", str(tmp_path / "no" / "x.png")]), 2, "does not exist")


def test_bench_plot_that_is_a_directory(tmp_path):
    check(runner.invoke(app, ["bench", "--plot", str(tmp_path)]), 2, "is a directory")


@pytest.mark.parametrize("script, needle", [
    ("vars:\n  a: {generate: choice, from: [Mon]}\n  b: {generate: choice, from: [Mon], unlike: a}\n"
     "conversations: [{turns: [{user: '{a}{b}'}]}]\n", "leaves no choice"),
    ("vars:\n  b: {generate: choice, from: [Mon, Tue], unlike: a}\n"
     "conversations: [{turns: [{user: '{b}'}]}]\n", "defined above it"),
    ("vars:\n  a: {generate: choice, from: [{x: 1}]}\nconversations: [{turns: [{user: '{a}'}]}]\n",
     "texts or numbers"),
    ("conversations: [{turns: [{user: 'hi {nope}'}]}]\n", "unknown variable {nope}"),
    ("conversations: [{turns: [{user: ''}]}]\n", "non-empty 'user'"),
    ("conversations: [unclosed\n", "line"),
    ("conversations: []\n", "non-empty 'conversations'"),
    ("conversations: [{turns: [{user: hi, expect_regex: '('}]}]\n", "not a valid regular expression"),
])
def test_bench_scripts_are_checked_when_they_load(tmp_path, script, needle):
    (tmp_path / "s.yaml").write_text(script)
    check(runner.invoke(app, ["bench", "--script", str(tmp_path / "s.yaml")]), 2, needle)


def test_bench_script_that_does_not_exist(tmp_path):
    check(runner.invoke(app, ["bench", "--script", str(tmp_path / "none.yaml")]), 2, "does not exist")


# --- saved sessions from another version, or damaged ----------------------------------------------

@pytest.mark.parametrize("sql, needle", [
    ("UPDATE sessions SET params = '{not json'", "params is not JSON"),
    ("UPDATE sessions SET params = '[1, 2]'", "params is not a JSON object"),
    ("UPDATE turns SET stats = '{broken'", "turn 1 stats is not JSON"),
    ("UPDATE turns SET user = x'00ff'", "turn 1 has a message that is not text"),
    ("UPDATE sessions SET backend = x'00ff'", "backend is not text"),
])
def test_a_damaged_session_names_itself_and_the_others_still_work(home, sql, needle):
    runner.invoke(app, ["sessions", "list"])
    store = SessionStore(home["db"])
    store.save(SavedSession(name="other", uid="u2", model="demo", backend="inproc", system=None, params={},
                            turns=(Turn("a", "b"),)))
    with sqlite3.connect(home["db"]) as conn:
        conn.execute(sql + " WHERE session_id = (SELECT id FROM sessions WHERE name = 'kept')"
                     if sql.startswith("UPDATE turns") else sql + " WHERE name = 'kept'")
    check(runner.invoke(app, ["sessions", "show", "kept"]), 1, f"saved session 'kept' is damaged: {needle}")
    check(runner.invoke(app, ["chat", "--resume", "kept", "x"]), 1, "saved session 'kept' is damaged")
    listed = runner.invoke(app, ["sessions", "list"])
    assert listed.exit_code == 0 and "kept" in listed.stdout and "other" in listed.stdout
    assert runner.invoke(app, ["sessions", "show", "other"]).exit_code == 0


def test_figures_from_a_newer_version_are_tolerated(home):
    with sqlite3.connect(home["db"]) as conn:
        conn.execute("""UPDATE turns SET stats = '{"version": 9, "prompt_tokens": 3, "think_tokens": 7}'""")
    shown = runner.invoke(app, ["sessions", "show", "kept"])
    assert shown.exit_code == 0 and "in 3" in shown.stdout


def test_a_file_that_is_not_a_database(home):
    home["db"].write_bytes(b"this is not sqlite" * 100)
    home["digest"] = _digest(home["db"])
    check(runner.invoke(app, ["sessions", "list"]), 1, "unreadable", home)
