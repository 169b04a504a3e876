"""Tools, the fourth role: schemas from signatures, calls read from a stream whichever way it is split,
every call checked, approved, run in its own process with a time limit and answered, and a history
in which a call never goes without its result, whatever trims, compacts, undoes or resumes it."""

from __future__ import annotations

import enum
import inspect
import json
import time
from pathlib import Path
from typing import Literal, Optional

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fakeserver import FakeServer, Reply, delta, sse
from localchat.backends import GenerationParams, TextChunk, ToolCall, ToolCallText
from localchat.backends.http import make_client
from localchat.backends.openai_http import ServerBackend
from localchat.backends.reply import ReplySplitter
from localchat.cli.app import app
from localchat.conversation.history import Conversation, ToolStep, Turn
from localchat.errors import UsageError
from localchat.store.saved_sessions import SavedSession, SessionStore
from localchat.templates.tool_formats import harmony_calls, json_reply
from localchat.tools.host import ToolHost
from localchat.tools.runner import REFUSED_UNASKED, ToolRunner, approve_all, refuse_unasked
from localchat.tools.schema import ToolDefinitionError, describe

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tools" / "add.py"


# --- schemas from signatures ----------------------------------------------------------------------

class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


KINDS = {  # a hint, values that fit it, and a value that does not
    "int": (int, st.integers(-10**6, 10**6), "x"),
    "float": (float, st.floats(allow_nan=False, allow_infinity=False, width=32), "x"),
    "str": (str, st.text(max_size=10), 3),
    "bool": (bool, st.booleans(), "yes"),
    "list[int]": (list[int], st.lists(st.integers(0, 9), max_size=3), [1, "x"]),
    "list[str]": (list[str], st.lists(st.text(max_size=3), max_size=3), "x"),
    "Colour": (Colour, st.sampled_from(["red", "blue"]), "green"),
    "Literal": (Literal["a", "b"], st.sampled_from(["a", "b"]), "c"),
    "Optional[int]": (Optional[int], st.one_of(st.none(), st.integers()), "x"),
    "int | None": (int | None, st.one_of(st.none(), st.integers()), 1.5),
}


def made(kinds: list[str], defaults: list[bool], doc: str = "A tool."):
    """A function with these parameters (a default where asked), as a user would write it."""
    def function(**kwargs):
        return kwargs

    parameters = [inspect.Parameter(f"p{i}", inspect.Parameter.KEYWORD_ONLY,
                                    default=None if default else inspect.Parameter.empty, annotation=KINDS[k][0])
                  for i, (k, default) in enumerate(zip(kinds, defaults))]
    function.__signature__ = inspect.Signature(parameters)
    function.__annotations__ = {p.name: p.annotation for p in parameters}
    function.__doc__ = doc
    return function


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), kinds=st.lists(st.sampled_from(list(KINDS)), max_size=5))
def test_any_describable_signature_gives_a_schema_its_arguments_fit(data, kinds):
    defaults = data.draw(st.lists(st.booleans(), min_size=len(kinds), max_size=len(kinds)))
    spec = describe(made(kinds, defaults), "tool")["function"]
    schema = spec["parameters"]
    jsonschema.Draft202012Validator.check_schema(schema)
    assert sorted(schema["required"]) == sorted(f"p{i}" for i, d in enumerate(defaults) if not d)
    arguments = {f"p{i}": data.draw(KINDS[k][1]) for i, (k, d) in enumerate(zip(kinds, defaults)) if not d}
    jsonschema.validate(arguments, schema)  # what fits the hints fits the schema
    for i, kind in enumerate(kinds):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**arguments, f"p{i}": KINDS[kind][2]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**arguments, "unknown": 1}, schema)


def test_the_docstring_gives_the_descriptions_and_defaults_are_kept():
    spec = describe(__import__("runpy").run_path(str(EXAMPLE))["add"], "add")["function"]
    assert spec["description"] == "Add two whole numbers and return their sum."
    assert spec["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first number"}

    def greet(name: str, times: int = 2, colour: Colour = Colour.RED) -> str:
        """Greet someone."""
    properties = describe(greet, "greet")["function"]["parameters"]["properties"]
    assert properties["times"]["default"] == 2 and properties["colour"] == {"type": "string", "enum": ["red", "blue"],
                                                                            "default": "red"}


def no_doc(a: int): ...
def no_hint(a): """Doc."""
def var_args(*a: int): """Doc."""
def a_dict(a: dict): """Doc."""
def a_union(a: int | str): """Doc."""
def mixed(a: Literal[1, "x"]): """Doc."""


@pytest.mark.parametrize("function, needle", [
    (no_doc, "no_doc: it has no docstring"), (no_hint, "no_hint: parameter 'a' has no type hint"),
    (var_args, "var_args: *a cannot be described"), (a_dict, "a_dict: parameter 'a' is a dict"),
    (a_union, "a_union: parameter 'a': a union of int, str"), (mixed, "mixed: parameter 'a': the choices"),
])
def test_a_function_that_cannot_be_described_is_refused_naming_it(function, needle):
    with pytest.raises(ToolDefinitionError, match=None) as refused:
        describe(function, function.__name__)
    assert needle in str(refused.value) and "\n" not in str(refused.value)


# --- calls read from a stream, however it is split ---------------------------------------------------

def split_everywhere(text: str, splitter_for) -> list[list]:
    """The events of ``text`` fed in two pieces, for every place it can be cut."""
    outcomes = []
    for cut in range(len(text) + 1):
        splitter = splitter_for()
        events = splitter.feed(text[:cut]) + splitter.feed(text[cut:]) + splitter.finish("stop")
        outcomes.append([(type(e).__name__, getattr(e, "text", None) or (e.name, json.loads(e.arguments)))
                         for e in events if isinstance(e, ToolCall) or isinstance(e, TextChunk) and e.text])
    return outcomes


class Markers:
    """A tokenizer's tool markers and parser as mlx_lm gives them (Qwen's JSON in <tool_call>)."""

    tool_call_start, tool_call_end = "<tool_call>", "</tool_call>"

    @staticmethod
    def tool_parser(text, tools):
        from mlx_lm.tool_parsers.json_tools import parse_tool_call

        return parse_tool_call(text, tools)


ADD = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
FORMATS = {
    "markers": (
        lambda: __import__("localchat.templates.tool_formats", fromlist=["markers"]).markers(Markers()),
        'Sure. <tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 5, "b": 1}}</tool_call>',
        [("TextChunk", "Sure. "), ("ToolCall", ("add", {"a": 2, "b": 3})), ("ToolCall", ("add", {"a": 5, "b": 1}))],
    ),
    "json": (json_reply, '{"name": "add", "parameters": {"a": 2, "b": 3}}', [("ToolCall", ("add", {"a": 2, "b": 3}))]),
    "harmony": (
        harmony_calls,
        '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}<|call|>',
        [("ToolCall", ("add", {"a": 2, "b": 3}))],
    ),
}


@pytest.mark.parametrize("name", FORMATS)
def test_a_call_is_read_whole_wherever_the_text_is_cut(name):
    make, text, expected = FORMATS[name]
    fmt = make()
    reasoning = (
        __import__("localchat.templates.reasoning_formats", fromlist=["harmony"]).harmony()
        if name == "harmony"
        else None
    )

    def splitter():
        return ReplySplitter(reasoning, tool_format=fmt, tools=ADD)

    for events in split_everywhere(text, splitter):
        merged = [e for e in events if e[0] != "TextChunk"]
        shown = "".join(e[1] for e in events if e[0] == "TextChunk")
        assert merged == [e for e in expected if e[0] != "TextChunk"]
        assert shown == "".join(e[1] for e in expected if e[0] == "TextChunk")  # no marker or call text shown


def test_a_json_reply_that_is_not_a_call_is_shown_as_the_answer():
    splitter = ReplySplitter(None, tool_format=json_reply(), tools=ADD)
    events = splitter.feed('{"just": "data"}') + splitter.finish("stop")
    assert [e for e in events if not isinstance(e, ToolCallText)] == [TextChunk('{"just": "data"}')]


@pytest.mark.parametrize("name", FORMATS)
def test_every_piece_of_a_call_arrives_on_the_clock_though_none_is_shown(name):
    """A call round's TTFT is its first token: once a call has begun, each piece the model writes is
    an event (``ToolCallText``) before the call comes out whole."""
    make, text, _ = FORMATS[name]
    reasoning = (
        __import__("localchat.templates.reasoning_formats", fromlist=["harmony"]).harmony()
        if name == "harmony"
        else None
    )
    splitter = ReplySplitter(reasoning, tool_format=make(), tools=ADD)
    fed = [splitter.feed(piece) for piece in text] + [splitter.finish("stop")]
    writing = [k for k, events in enumerate(fed) if any(isinstance(e, ToolCallText) for e in events)]
    first_call = next(k for k, events in enumerate(fed) if any(isinstance(e, ToolCall) for e in events))
    assert writing and writing[0] < first_call
    assert all(fed[k] for k in range(writing[0], first_call)), [k for k in range(writing[0], first_call) if not fed[k]]
    assert not any(isinstance(e, TextChunk) and "add" in e.text for events in fed for e in events)


def streamed_calls() -> bytes:
    """Two calls in one message, their ids, names and arguments split across chunks and interleaved."""
    pieces = [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "add", "arguments": ""}},
        {"index": 1, "id": "call_b", "type": "function", "function": {"name": "add", "arguments": '{"a": 5'}},
        {"index": 0, "function": {"arguments": '{"a": 2, '}},
        {"index": 1, "function": {"arguments": ', "b": 1}'}},
        {"index": 0, "function": {"arguments": '"b": 3}'}},
    ]
    chunks = [{"choices": [{"index": 0, "delta": {"tool_calls": [p]}, "finish_reason": None}]} for p in pieces]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return b"".join(sse(*chunks))


def test_streamed_tool_calls_are_assembled_by_index_at_every_byte_boundary():
    body = streamed_calls()
    for cut in range(len(body) + 1):
        def handler(request: httpx.Request, cut: int = cut) -> httpx.Response:
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_TwoPieces(body, cut))

        backend = ServerBackend(make_client("http://test/v1", transport=httpx.MockTransport(handler)), "m")
        events = list(backend.stream([{"role": "user", "content": "hi"}], GenerationParams()))
        calls = [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]
        assert calls == [("add", {"a": 2, "b": 3}), ("add", {"a": 5, "b": 1})], cut
        assert events[-1].finish_reason == "tool_calls"


class _TwoPieces(httpx.SyncByteStream):
    def __init__(self, body: bytes, cut: int):
        self.body, self.cut = body, cut

    def __iter__(self):
        yield self.body[:self.cut]
        yield self.body[self.cut:]


# --- running calls: checked, approved, limited ---------------------------------------------------------

TOOLS = '''
import time

def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b

def boom(reason: str) -> str:
    """Raise an error."""
    raise ValueError(reason)

def hang(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "woke"

def chatty(n: int) -> None:
    """Print a lot."""
    print("x" * n)
'''


@pytest.fixture(scope="module")
def tool_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tools") / "tools.py"
    path.write_text(TOOLS)
    return path


@pytest.fixture(scope="module")
def host(tool_file):
    running = ToolHost([tool_file], timeout_s=2.0)
    yield running
    running.close()


def call(name: str, arguments, problem: str | None = None) -> ToolCall:
    return ToolCall("abc123def", name, arguments if isinstance(arguments, str) else json.dumps(arguments), problem)


@pytest.mark.parametrize("the_call, status, needle", [
    (call("add", {"a": 2, "b": 3}), "ok", "5"),
    (call("add", '{"a": 2, "b": '), "invalid", "the arguments are not valid JSON"),
    (call("add", {"a": "two", "b": 3}), "invalid", "do not fit add's parameters (a: 'two' is not of type 'integer')"),
    (call("add", {"a": 2}), "invalid", "'b' is a required property"),
    (call("add", "[1, 2]"), "invalid", "must be a JSON object"),
    (call("nope", {}), "invalid", "there is no tool named 'nope'"),
    (call("", "<tool_call>{oops", problem="Expecting value"), "invalid", "could not be read (Expecting value)"),
    (call("boom", {"reason": "bad input"}), "error", "error: ValueError: bad input"),
    (call("chatty", {"n": 10_000_000}), "ok", "more characters cut"),
])
def test_every_call_gets_a_result_the_model_can_read(host, the_call, status, needle):
    done = ToolRunner([host], approve_all).run(the_call)
    assert done.status == status and needle in done.content, done
    assert len(done.content) < 17_000


def test_a_tool_that_hangs_is_stopped_and_the_next_call_works(host):
    tools = ToolRunner([host], approve_all)
    started = time.monotonic()
    stopped = tools.run(call("hang", {"seconds": 60}))
    assert stopped.status == "timeout" and "did not finish within 2s" in stopped.content
    assert time.monotonic() - started < 30  # not the tool's 60 s
    assert tools.run(call("add", {"a": 1, "b": 1})).content == "2"  # a new process, the same tools


def test_without_approval_a_call_is_refused_and_the_refusal_is_its_result(host):
    done = ToolRunner([host], refuse_unasked).run(call("add", {"a": 2, "b": 3}))
    assert (done.status, done.content) == ("refused", REFUSED_UNASKED)


@pytest.mark.parametrize("source, needle", [
    ("def f(a: int): return a\n", "f: it has no docstring"),
    ("def f(a: object):\n    '''Doc.'''\n", "f: parameter 'a' is a object"),
    ("x = 1\n", "defines no public function"),
    ("def f(:\n", "line 1"),
    ("raise SystemExit(3)\n", "importing it failed: SystemExit: 3"),
    ("import no_such_module_here\n", "ModuleNotFoundError"),
])
def test_a_tools_file_that_cannot_be_offered_is_one_line(tmp_path, source, needle):
    path = tmp_path / "bad.py"
    path.write_text(source)
    with pytest.raises(Exception) as refused:
        ToolHost([path], timeout_s=10)
    assert needle in str(refused.value) and "\n" not in str(refused.value)


# --- the history: a call never without its result --------------------------------------------------------

def step(i: int, calls: int) -> ToolStep:
    ids = [f"c{i:02d}x{k:04d}" for k in range(calls)]
    return ToolStep(
        text="",
        calls=tuple({"id": c, "name": "add", "arguments": {"a": k, "b": 1}} for k, c in enumerate(ids)),
        results=tuple(str(k + 1) for k in range(calls)),
    )


def whole(messages: list[dict]) -> bool:
    """Every tool message answers a call of the assistant message just before its run of results,
    and every call of such a message has its result."""
    i = 0
    while i < len(messages):
        message = messages[i]
        if message["role"] == "tool":
            return False  # a result with no call before it
        if message.get("tool_calls"):
            ids = [c["id"] for c in message["tool_calls"]]
            results = messages[i + 1:i + 1 + len(ids)]
            if [m.get("tool_call_id") for m in results] != ids or any(m["role"] != "tool" for m in results):
                return False
            i += len(ids)
        i += 1
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.lists(st.integers(1, 3), max_size=2), min_size=1, max_size=8),
       operations=st.lists(st.sampled_from(["trim", "window", "compact", "undo", "save"]), max_size=6),
       budget=st.integers(60, 900))
def test_trimming_compaction_undo_and_resume_keep_each_call_with_its_result(tmp_path, shape, operations, budget):
    conversation = Conversation("S", [Turn(f"q{i}", f"a{i}", steps=tuple(step(i * 10 + j, n) for j, n in
                                                                          enumerate(rounds)))
                                      for i, rounds in enumerate(shape)])
    count = lambda messages: len(json.dumps(messages))  # noqa: E731 (a character "token")
    for operation in operations:
        if operation == "trim" and conversation.turns:
            try:
                drop = conversation.plan_trim("next", max_tokens=budget, count_tokens=count, low_water=0.5)
            except UsageError:  # even the question alone does not fit: nothing would be sent
                continue
            assert whole(conversation.preview("next", drop=drop))
        elif operation == "window":
            assert whole(conversation.preview("next", drop=conversation.plan_trim("next", max_turns=2)))
        elif operation == "compact":
            conversation.compact("Notes: tool results 1, 2.", keep=1)
        elif operation == "undo" and conversation.turns:
            conversation.take_back()
        elif operation == "save":
            store = SessionStore(tmp_path / "db.sqlite3")
            store.save(SavedSession("s", "u", "m", "inproc", conversation.system, {}, tuple(conversation.turns)))
            assert store.load("s").turns == tuple(conversation.turns)
            assert [t.steps for t in store.load("s").turns] == [t.steps for t in conversation.turns]
        assert whole(conversation.messages())


def test_a_saved_round_that_lost_a_result_is_refused_as_damaged(tmp_path):
    import sqlite3

    store = SessionStore(tmp_path / "db.sqlite3")
    store.save(SavedSession("s", "u", "m", "inproc", None, {}, (Turn("q", "a", steps=(step(1, 2),)),)))
    with sqlite3.connect(store.path) as db:
        stored = json.loads(db.execute("SELECT steps FROM turns").fetchone()[0])
        stored[0]["results"] = stored[0]["results"][:1]
        db.execute("UPDATE turns SET steps = ?", (json.dumps(stored),))
    with pytest.raises(Exception, match="tool calls are not whole"):
        store.load("s")


# --- through the command line, against a server that asks for add ------------------------------------------

def asks_for_add(answer: str = "2 plus 3 is 5.") -> list[Reply]:
    first = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "type": "function", "function": {
        "name": "add", "arguments": '{"a": 2, "b": 3}'}}]}, "finish_reason": "tool_calls"}]}
    return [Reply(chunks=sse(first)), Reply(chunks=sse(delta(answer, "stop")))]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_server_that_asks_for_add_gets_its_result_and_the_pipe_gets_the_answer_alone(home, tmp_path):
    server = FakeServer()
    server.chat(asks_for_add())
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools",
                                   str(EXAMPLE), "--approve-tools", "--record", str(tmp_path / "r"),
                                   "What is 2 plus 3?"])
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    assert done.stdout == "2 plus 3 is 5.\n"
    assert "→ add({\"a\": 2, \"b\": 3})" in done.stderr and "← 5" in done.stderr and "rounds 2 · tools" in done.stderr
    bodies = [json.loads(b) for p, _, b in server.requests if p.endswith("completions")]
    assert [m["role"] for m in bodies[1]["messages"]] == ["user", "assistant", "tool"]
    sent_call, result = bodies[1]["messages"][1]["tool_calls"][0], bodies[1]["messages"][2]
    assert sent_call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}  # JSON text on the wire
    assert result == {"role": "tool", "tool_call_id": sent_call["id"], "name": "add", "content": "5"}
    assert bodies[0]["tools"][0]["function"]["name"] == "add"
    records = sorted((tmp_path / "r").glob("*-response.json"))
    assert [json.loads(r.read_text())["tool_calls"] is not None for r in records] == [True, False]



@pytest.mark.parametrize("pieces", [['{"a": 2, "b": 3}'], ['{"a": ', '2, "b"', ': 3}']], ids=["whole", "streamed"])
def test_a_call_round_is_timed_from_its_first_piece_and_a_call_sent_whole_has_no_decode_rate(host, pieces):
    """mlx_lm.server sends a call whole once it is written: one arrival, so TTFT and no tok/s. A server
    that streams the arguments gives a first token and a rate, as for text."""
    from localchat.backends.openai_http import backend_for
    from localchat.conversation.turn import ChatSession

    def piece(k: int, arguments: str) -> dict:
        call = {"index": 0, "function": {"arguments": arguments}}
        if k == 0:
            call.update(id="x", type="function", function={"name": "add", "arguments": arguments})
        return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}

    usage = {"prompt_tokens": 30, "completion_tokens": 12}
    server = FakeServer()
    server.chat(
        [
            Reply(
                chunks=sse(
                    *[piece(k, a) for k, a in enumerate(pieces)],
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "usage": usage},
                ),
                pause_s=0.3,
            ),
            Reply(chunks=sse(delta("5", "stop"))),
        ]
    )
    backend = backend_for(server.base_url, None)
    try:
        result = ChatSession(
            backend, Conversation(None), GenerationParams(), tools=ToolRunner([host], approve_all)
        ).ask("What is 2 plus 3?")
    finally:
        backend.close()
        server.close()
    [calling] = result.rounds
    assert result.committed and calling.ttft_s >= 0.25 and calling.total_s >= calling.ttft_s
    if len(pieces) == 1:
        assert calling.decode_tps is None
    else:
        assert calling.ttft_s < 0.55 and calling.decode_tps == pytest.approx(11 / 0.6, rel=0.5)

def test_without_a_terminal_or_approval_the_model_hears_the_refusal(home):
    server = FakeServer()
    server.chat(asks_for_add("I may not use the tool."))
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools",
                                   str(EXAMPLE), "What is 2 plus 3?"])
    finally:
        server.close()
    assert done.exit_code == 0 and "no terminal to ask: calls are refused" in done.stderr
    result = json.loads(server.requests[-1][2])["messages"][-1]
    assert result["role"] == "tool" and result["content"] == REFUSED_UNASKED


def test_a_model_that_never_stops_calling_ends_the_turn_at_the_round_limit(home):
    server = FakeServer()
    server.chat(asks_for_add()[:1])  # always asks again
    try:
        done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "--tools",
                                   str(EXAMPLE), "--approve-tools", "--max-tool-rounds", "2", "What is 2 plus 3?"])
    finally:
        server.close()
    assert done.exit_code == 1 and "still called tools after 2 rounds (--max-tool-rounds)" in done.stderr
    assert sum(p.endswith("completions") for p, _, _ in server.requests) == 3


@pytest.mark.parametrize("args, needle", [
    (["--tools", "/nonexistent/tools.py"], "--tools /nonexistent/tools.py: no such file"),
    (["--tools", "{tmp}"], "not a file"),
    (["--tools", "{tmp}/notes.txt"], "not a Python file"),
    (["--tools", "{tmp}/broken.py"], "broken.py: line 1"),
    (["--tools", "{tmp}/nodoc.py"], "f: it has no docstring"),
    (["--tools", str(EXAMPLE), "--tools", str(EXAMPLE)], "add.py is given twice"),
    (["--tools", str(EXAMPLE), "--tools", "{tmp}/add_again.py"], "'add' is already a tool from /"),
    (["--tools", "{tmp}/helper.py"], "helper.py: helper: it has no docstring (the model reads it to know what the tool "
                                     "does); a helper that is not a tool: name it _helper"),
    (["--tools", "{tmp}/nan.py"], "f: parameter 'x': its default is NaN or infinity"),
    (["--tools", "{tmp}/huge.py"], "f: parameter 'n': its default is a number too large for JSON"),
    (["--approve-tools"], "--approve-tools goes with --tools FILE.py or --mcp FILE, and no tools are offered"),
    (["--tool-timeout", "5"], "--tool-timeout goes with --tools FILE.py"),
    (["--max-tool-rounds", "2"], "--max-tool-rounds goes with --tools FILE.py"),
    (["--tools", str(EXAMPLE), "--tool-timeout", "0"], "--tool-timeout"),
    (["--tools", str(EXAMPLE), "--tool-timeout", "nan"], "--tool-timeout"),
    (["--tools", str(EXAMPLE), "--tool-timeout", "1e99"], "--tool-timeout"),
    (["--tools", str(EXAMPLE), "--max-tool-rounds", "0"], "--max-tool-rounds"),
    (["--tools", str(EXAMPLE), "--max-tool-rounds", "abc"], "--max-tool-rounds"),
    (["--tools", str(EXAMPLE)], "demo's chat template has no tool support"),
])
def test_bad_tool_options_are_one_line_exit_2_and_nothing_written(home, tmp_path, args, needle):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "nodoc.py").write_text("def f(a: int):\n    return a\n")
    (tmp_path / "add_again.py").write_text("def add(a: int) -> int:\n    '''Add.'''\n    return a\n")
    (tmp_path / "helper.py").write_text("def add(a: int) -> int:\n    '''Add.'''\n    return helper(a)\n\n"
                                        "def helper(x):\n    return x\n")
    (tmp_path / "nan.py").write_text("def f(x: float = float('nan')) -> float:\n    '''Doc.'''\n    return x\n")
    (tmp_path / "huge.py").write_text("def f(n: int = 10**5000) -> int:\n    '''Doc.'''\n    return 1\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = runner.invoke(app, ["chat", *args, "--record", str(tmp_path / "records"), "What is 2 plus 3?"])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.exit_code == 2 and len(errors) == 1 and needle in errors[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "records").exists() and not home.exists()


def test_slash_tools_lists_them_and_stats_counts_rounds_and_tool_time(home):
    server = FakeServer()
    server.chat(asks_for_add())
    try:
        done = runner.invoke(
            app,
            ["chat", "--backend", "server", "--base-url", server.base_url, "--tools", str(EXAMPLE), "--approve-tools"],
            input="/tools\nWhat is 2 plus 3?\n/history\n/stats\n/save sums\n/quit\n",
        )
    finally:
        server.close()
    assert done.exit_code == 0, done.stderr
    assert "add(a: integer, b: integer) — Add two whole numbers and return their sum." in done.stderr
    assert "assistant: → add({\"a\": 2, \"b\": 3})" in done.stderr and "tool (add): 5" in done.stderr
    assert "tool rounds 1 · tool calls 1 · time inside tools" in done.stderr and "turns 1 " in done.stderr
    shown = runner.invoke(app, ["sessions", "show", "sums"]).stdout
    assert 'tool: add({"a": 2, "b": 3}) → 5' in shown
    exported = json.loads(runner.invoke(app, ["sessions", "export", "sums", "--format", "json"]).stdout)
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert exported["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}


def test_a_terminal_asks_before_each_call_and_always_means_this_session(tmp_path):
    from pty_chat import PROMPT, quit, send, spawn

    server = FakeServer()
    server.chat(asks_for_add("Done."))
    try:
        child = spawn("--backend", "server", "--base-url", server.base_url, "--tools", str(EXAMPLE), home=tmp_path)
        for answer, heard in (("n", "← refused: the user did not approve this call"), ("a", "← 5"), (None, "← 5")):
            send(child, "What is 2 plus 3?")
            child.expect_exact('→ add({"a": 2, "b": 3})')
            if answer is not None:
                child.expect_exact("run add? [y]es / [n]o / [a]lways for add:")
                assert "asks to run" not in child.before and "in full" not in child.before  # the call shown once
                send(child, answer)
            child.expect_exact(heard)  # the third call is not asked again: "always" holds (else this waits)
            child.expect_exact("Done.")
            child.expect_exact(PROMPT)
        quit(child)
    finally:
        server.close()
    results = [json.loads(body)["messages"][-1]["content"] for path, _, body in server.requests
               if path.endswith("completions") and json.loads(body)["messages"][-1]["role"] == "tool"]
    assert results == ["refused: the user did not approve this call", "5", "5"]


def test_bench_and_load_run_the_tools_and_count_rounds_tool_time_and_tokens(home, tmp_path):
    script = tmp_path / "sums.yaml"
    script.write_text("name: sums\nconversations:\n  - turns:\n      - user: What is 2 plus 3?\n"
                      "      - user: And 4 plus 4?\n")
    server = FakeServer()
    usage = {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 5}}
    first = asks_for_add()[0]
    answer = Reply(
        chunks=sse(delta("5.", "stop"), {"choices": [], "usage": {"prompt_tokens": 61, "completion_tokens": 2}})
    )
    call = Reply(chunks=first.chunks[:-1] + sse(usage))  # demo-tools lends the template
    server.chat(lambda body: answer if body["messages"][-1]["role"] == "tool" else call)  # 2 users at once
    try:
        refused = runner.invoke(app, ["bench", "-m", "demo-tools", "--backend", "server", "--base-url",
                                      server.base_url, "--tools", str(EXAMPLE), "--script", str(script)])
        bench = runner.invoke(app, ["bench", "-m", "demo-tools", "--backend", "server", "--base-url", server.base_url,
                                    "--history", "on",
                                    "--tools", str(EXAMPLE), "--approve-tools", "--script", str(script), "--out",
                                    str(tmp_path / "bench")])
        load = runner.invoke(app, ["load", "--base-url", server.base_url, "--users", "2", "--conversations", "1",
                                   "--warmup", "0", "--history", "on", "--script", str(script), "--tools", str(EXAMPLE),
                                   "--approve-tools", "--out", str(tmp_path / "load")])
    finally:
        server.close()
    assert refused.exit_code == 2 and "needs --approve-tools" in refused.stderr
    assert bench.exit_code == 0, bench.stderr
    assert (
        "server history-on: tools: 2 calls in 2 rounds" in bench.stdout
        and "add 21 prompt tokens a turn" in bench.stdout
    )
    turns = json.loads((tmp_path / "bench" / "results.json").read_text())["turns"]
    assert [(t["tool_rounds"], t["tool_calls"], t["tool_prompt_tokens"]) for t in turns] == [(1, 1, 21)] * 2
    assert load.exit_code == 0, load.stdout + load.stderr
    assert "2 users, history on: tools: 4 rounds of calls" in " ".join(load.stdout.split())
    run = json.loads((tmp_path / "load" / "results.json").read_text())["runs"][0]
    assert run["tools"]["rounds"] == 4 and run["tools"]["prompt_tokens_per_request"] == 21
