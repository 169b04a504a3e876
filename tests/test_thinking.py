"""Thinking models: reasoning kept apart from the answer, TTFT and TTFA on one clock, in-process
with the bundled thinking toy (demo-think) and through fakes of servers that send reasoning."""

import io
import json
import sqlite3

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from localchat.backends import GenerationParams, ReasoningChunk, TextChunk
from localchat.backends.inproc import InProcessBackend
from localchat.backends.openai_http import ServerBackend
from localchat.backends.reply import ReplySplitter
from localchat.cli.render import ChatUI
from localchat.cli.repl import Repl
from localchat.conversation.history import Conversation, Turn
from localchat.conversation.turn import ChatSession, TurnStatus
from localchat.grammar.answer_formats import default_schema
from localchat.registry import PACKAGE_DIR
from localchat.store import keeper, saved_sessions, schema, session_export
from localchat.templates.reasoning_formats import think_markers

THINK_DIR = PACKAGE_DIR / "demo_think_model"
SYSTEM = "You are a helpful assistant."
REMEMBER = "Remember the code harbor 17. Reply only OK."
RECALL = "What was the code? Reply with the code only."
BASE = "http://127.0.0.1:1/v1/"


@pytest.fixture(scope="module")
def toy():
    from mlx_lm import load

    return load(str(THINK_DIR))


def session(toy, think=None, cache_reuse=True, max_tokens=64) -> ChatSession:
    model, tokenizer = toy
    backend = InProcessBackend(model, tokenizer, "demo-think", cache_reuse=cache_reuse)
    return ChatSession(backend, Conversation(SYSTEM), GenerationParams(max_tokens=max_tokens, think=think))


def split_all(tokenizer, pieces: list[str]) -> tuple[str, str]:
    splitter = ReplySplitter.for_prompt(think_markers(), tokenizer, tokenizer.encode("<|im_start|>assistant\n"))
    chunks = [c for piece in pieces for c in splitter.feed(piece, 0)] + splitter.finish("stop")
    return ("".join(c.text for c in chunks if isinstance(c, ReasoningChunk)),
            "".join(c.text for c in chunks if isinstance(c, TextChunk)))


def test_the_toy_is_a_thinking_model_to_mlx_lm(toy):
    _, tokenizer = toy
    assert (tokenizer.has_thinking, tokenizer.think_start, tokenizer.think_end) == (True, "<think>", "</think>")
    off = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                        tokenize=False, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think></think>")


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=12))
def test_reasoning_and_answer_are_the_same_wherever_the_text_is_cut(toy, cuts):
    """Markers split across chunks are still found: the detokenizer may hand them over in pieces."""
    text = "<think>I should reply: harbor 17</think>harbor 17"
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert split_all(toy[1], pieces) == ("I should reply: harbor 17", "harbor 17")


def test_a_prompt_that_opens_the_think_block_starts_in_reasoning(toy):
    _, tokenizer = toy
    splitter = ReplySplitter.for_prompt(think_markers(), tokenizer, tokenizer.encode("<|im_start|>assistant\n<think>"))
    chunks = splitter.feed("plan</think>", tokenizer.convert_tokens_to_ids("</think>")) + splitter.feed("done", 5)
    assert [type(c).__name__ for c in chunks] == ["ReasoningChunk", "TextChunk"]
    assert splitter.reasoning_tokens == 1  # the end marker; the start marker was the prompt's


def test_reasoning_is_never_in_the_answer_nor_committed(toy):
    chat = session(toy, think=True)
    first = chat.ask(REMEMBER)
    second = chat.ask(RECALL)
    for result in (first, second):
        assert result.status is TurnStatus.COMMITTED
        assert result.reasoning.startswith("I should reply:")
        assert "<think>" not in result.text and "I should reply" not in result.text
        assert result.stats.ttft_s < result.stats.ttfa_s
    assert first.text == "OK"
    assert [t.assistant for t in chat.conversation.turns] == [first.text, second.text]
    assert [t.reasoning for t in chat.conversation.turns] == [first.reasoning, second.reasoning]
    assert "I should reply" not in json.dumps(second.messages)  # the reasoning was not sent back


def test_reasoning_tokens_are_counted_exactly_in_process(toy):
    _, tokenizer = toy
    result = session(toy, think=True).ask(REMEMBER)
    thought = tokenizer.encode(f"<think>{result.reasoning}</think>", add_special_tokens=False)
    answer = tokenizer.encode(result.text, add_special_tokens=False)
    assert result.stats.reasoning_tokens == len(thought)
    assert result.stats.completion_tokens == len(thought) + len(answer) + 1  # + the end-of-turn token
    assert not result.stats.reasoning_estimated


def test_no_think_answers_directly(toy):
    result = session(toy, think=False).ask(REMEMBER)
    assert (result.text, result.reasoning, result.stats.reasoning_tokens) == ("OK", "", 0)
    assert result.stats.ttfa_s == result.stats.ttft_s


def test_kv_reuse_trims_the_dropped_reasoning_and_matches_a_full_prefill(toy):
    """The template drops turn one's reasoning: the cache keeps turn one's prompt, drops what was
    generated after it, and the replies equal those of re-prefilling every turn."""
    reused, fresh = session(toy, think=True), session(toy, think=True, cache_reuse=False)
    questions = [REMEMBER, RECALL, "Thanks!"]
    got = [reused.ask(q) for q in questions]
    assert [r.text for r in got] == [fresh.ask(q).text for q in questions]
    prompt_one = reused.backend.count_tokens(got[0].messages, think=True)
    assert got[1].stats.cached_tokens == prompt_one
    assert got[1].stats.cache_miss_tokens == got[0].stats.completion_tokens
    assert got[2].stats.cached_tokens == got[1].stats.prompt_tokens


def test_a_cache_that_cannot_be_trimmed_restarts_from_its_checkpoint(tmp_path):
    """A hybrid model (lfm2: convolution layers, ArraysCache): the history changes after the
    prompt, as when the template drops the reasoning; the checkpoint at the end of the prompt
    saves the prefill, and greedy output is the same as from scratch."""
    from mlx_lm import load
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    from demo.random_model import build_hybrid_model

    model, tokenizer = load(str(build_hybrid_model(tmp_path / "hybrid")))
    assert not can_trim_prompt_cache(make_prompt_cache(model))
    first = [{"role": "user", "content": REMEMBER}]
    second = first + [{"role": "assistant", "content": "OK"}, {"role": "user", "content": RECALL}]
    params = GenerationParams(max_tokens=6)

    def two_turns(checkpoints: bool):
        backend = InProcessBackend(model, tokenizer, "hybrid", checkpoints=checkpoints)
        list(backend.stream(first, params))
        events = list(backend.stream(second, params))
        return "".join(e.text for e in events if isinstance(e, TextChunk)), events[-1]

    text, done = two_turns(checkpoints=True)
    plain_text, plain = two_turns(checkpoints=False)
    scratch = InProcessBackend(model, tokenizer, "hybrid", cache_reuse=False).stream(second, params)
    assert text == plain_text == "".join(e.text for e in scratch if isinstance(e, TextChunk))
    assert done.cached_tokens == len(tokenizer.apply_chat_template(first, add_generation_prompt=True)) - 1
    assert plain.cached_tokens == 0


# Servers that send reasoning: mlx_lm.server's delta.reasoning, vLLM/DeepSeek's reasoning_content.

def sse(*payloads, done=True) -> bytes:
    body = "".join(f"data: {json.dumps(p)}\n\n" for p in payloads)
    return (body + ("data: [DONE]\n\n" if done else "")).encode()


def chunk(field=None, text=None, finish=None):
    delta = {field: text} if field else {}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def server_session(body: bytes, tokenizer_loader=None, schema=None) -> tuple[ChatSession, list]:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(404)
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    client = httpx.Client(base_url=BASE, transport=httpx.MockTransport(handler), timeout=2.0)
    backend = ServerBackend(client, "default_model", load_tokenizer=tokenizer_loader)
    conversation = Conversation(SYSTEM)
    return ChatSession(backend, conversation, GenerationParams(max_tokens=32, think=True), schema=schema), seen


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_both_server_styles_give_the_same_events_and_figures(field):
    usage = {"prompt_tokens": 20, "completion_tokens": 9}
    body = sse(chunk(field, "Let me "), chunk(field, "see."), chunk("content", "harbor"),
               chunk("content", " 17", "stop"), {"choices": [], "usage": usage})
    chat, seen = server_session(body)
    result = chat.ask(RECALL)
    assert (result.reasoning, result.text, result.status) == ("Let me see.", "harbor 17", TurnStatus.COMMITTED)
    assert result.stats.ttft_s < result.stats.ttfa_s
    assert result.stats.reasoning_tokens == 2 and result.stats.reasoning_estimated  # counted from chunks
    assert chat.conversation.turns[0].assistant == "harbor 17"
    assert seen[0]["chat_template_kwargs"] == {"enable_thinking": True}


def test_reasoning_over_http_is_counted_with_the_local_tokenizer(toy):
    _, tokenizer = toy
    body = sse(chunk("reasoning", "I should reply: OK"), chunk("content", "OK", "stop"),
               {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 15}})
    result = server_session(body, tokenizer_loader=lambda: tokenizer)[0].ask(REMEMBER)
    expected = len(tokenizer.encode("<think>I should reply: OK</think>", add_special_tokens=False))
    assert result.stats.reasoning_tokens == expected and result.stats.reasoning_estimated


def test_a_stream_cut_inside_the_reasoning_commits_nothing():
    chat, _ = server_session(sse(chunk("reasoning_content", "Let me"), done=False))
    result = chat.ask(RECALL)
    assert result.status is TurnStatus.ERROR and result.reasoning == "Let me" and result.text == ""
    assert chat.conversation.turns == []


def test_a_reply_cut_at_max_tokens_inside_its_reasoning_is_not_committed_and_says_where():
    chat, _ = server_session(sse(chunk("reasoning", "Let me think about", "length")))
    result = chat.ask(RECALL)
    assert result.status is TurnStatus.CUT and chat.conversation.turns == []
    err = io.StringIO()
    ChatUI(out=io.StringIO(), err=Console(file=err, width=200)).end_turn(result, 32)
    assert "inside its reasoning" in err.getvalue()


def test_json_mode_validates_the_answer_only():
    body = sse(chunk("reasoning", "not JSON {"), chunk("content", '{"answer": "harbor 17"}', "stop"))
    chat, _ = server_session(body, schema=default_schema())
    result = chat.ask(RECALL)
    assert result.status is TurnStatus.COMMITTED and result.answer == {"answer": "harbor 17"}


@pytest.mark.parametrize(
    "pieces",
    [
        ["<think>Let me see.</think>harbor 17"],
        ["<th", "ink>Let me ", "see.</thi", "nk>harbor", " 17"],
        ["\n<think>Let me see.</think>", "harbor 17"],
    ],
)
def test_reasoning_inside_content_is_split_when_the_stream_opens_with_a_marker(pieces):
    """llama-server without a reasoning format, vLLM without a parser: <think> arrives in content."""
    body = sse(*[chunk("content", p) for p in pieces[:-1]], chunk("content", pieces[-1], "stop"))
    result = server_session(body)[0].ask(RECALL)
    assert (result.reasoning, result.text.strip(), result.status) == ("Let me see.", "harbor 17", TurnStatus.COMMITTED)


def test_reasoning_inside_content_is_split_with_the_local_markers_when_the_prompt_opened_it(toy):
    """A template that writes <think> itself: the content starts inside the reasoning."""
    _, tokenizer = toy
    tokenizer._tokenizer.chat_template += "<think>"  # now every prompt ends inside an open think block
    try:
        body = sse(chunk("content", "Let me see.</think>"), chunk("content", "harbor 17", "stop"))
        result = server_session(body, tokenizer_loader=lambda: tokenizer)[0].ask(RECALL)
    finally:
        tokenizer._tokenizer.chat_template = tokenizer._tokenizer.chat_template.removesuffix("<think>")
    assert (result.reasoning, result.text) == ("Let me see.", "harbor 17")


def test_content_is_left_alone_when_the_server_splits_reasoning_itself(toy):
    _, tokenizer = toy
    body = sse(chunk("reasoning", "Let me see."), chunk("content", "a <think> in the answer", "stop"))
    result = server_session(body, tokenizer_loader=lambda: tokenizer)[0].ask(RECALL)
    assert (result.reasoning, result.text) == ("Let me see.", "a <think> in the answer")


# Display: reasoning never reaches stdout.

def render_turn(show_thinking: bool, terminal: bool) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    ui = ChatUI(out=out, err=Console(file=err, force_terminal=terminal, width=200), show_thinking=show_thinking)
    for piece in ("I should ", "reply: OK"):
        ui.reasoning(piece)
    ui.text("OK")
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize("show_thinking", [False, True])
@pytest.mark.parametrize("terminal", [False, True])
def test_reasoning_goes_to_stderr_only(show_thinking, terminal):
    out, err = render_turn(show_thinking, terminal)
    assert out == "OK"
    assert ("I should reply: OK" in err.replace("\x1b[2m", "").replace("\x1b[0m", "")) == show_thinking
    assert ("thinking… 2" in err) == (terminal and not show_thinking)


def test_the_figures_line_shows_both_times_and_the_reasoning_tokens(toy):
    from localchat.conversation.stats import stats_line

    thought = stats_line(session(toy, think=True).ask(REMEMBER).stats)
    direct = stats_line(session(toy, think=False).ask(REMEMBER).stats)
    assert thought.startswith("[TTFT ") and " · answer " in thought and " · think 13 · " in thought
    assert "answer" not in direct and "think" not in direct


def test_repl_think_command_switches_the_next_turns(toy):
    lines = iter(["/think off", REMEMBER, "/think on", REMEMBER, "/think maybe", "/quit"])
    chat = session(toy)
    err = io.StringIO()
    Repl(chat, ChatUI(out=io.StringIO(), err=Console(file=err, width=200)), read_line=lambda _: next(lines)).run()
    assert [bool(t.reasoning) for t in chat.conversation.turns] == [False, True]
    assert "usage: /think on|off" in err.getvalue()


# Kept beside the turn: saved sessions and history for templates that read it.

def test_saved_sessions_keep_the_reasoning_and_old_databases_migrate(tmp_path, toy):
    chat = session(toy, think=True)
    chat.ask(REMEMBER)
    old = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(old)
    conn.executescript(schema.MIGRATIONS[0])
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    store = saved_sessions.SessionStore(old)
    saver = keeper.SessionSaver(store, "uid-1", "demo-think")
    saver.save(chat, "thought")
    loaded = store.load("thought")
    assert loaded.turns[0].reasoning == chat.conversation.turns[0].reasoning != ""
    assert "<summary>Reasoning</summary>" in session_export.export_markdown(loaded)
    assert json.loads(session_export.export_json(loaded))["turn_reasoning"] == [loaded.turns[0].reasoning]


def test_reasoning_goes_back_only_when_the_template_reads_it(toy):
    assert session(toy).backend.template.traits.reasoning_field is None  # the toy's template reads none
    conversation = Conversation(SYSTEM, reasoning_field="reasoning_content")
    conversation.commit(Turn("q", "a", reasoning="because"))
    assert conversation.preview("next")[2] == {"role": "assistant", "content": "a", "reasoning_content": "because"}
    conversation.reasoning_field = None
    assert conversation.preview("next")[2] == {"role": "assistant", "content": "a"}


# The same model through a real mlx_lm.server, and the CLI a user runs.

@pytest.fixture(scope="module")
def think_server(tmp_path_factory):
    from servers import serving

    with serving("demo-think", tmp_path_factory.mktemp("log")) as server:
        yield server


@pytest.mark.parametrize("think", [True, False])
def test_in_process_and_mlx_lm_server_agree_on_texts_and_counts(toy, think_server, think):
    from localchat.backends.openai_http import backend_for
    from localchat.registry import resolve

    backend = backend_for(think_server.base_url, resolve("demo-think"))  # lends the local tokenizer itself
    over_http = ChatSession(backend, Conversation(SYSTEM), GenerationParams(max_tokens=64, think=think))
    local = session(toy, think=think)
    for question in (REMEMBER, RECALL):
        a, b = local.ask(question), over_http.ask(question)
        assert (a.reasoning, a.text, a.status) == (b.reasoning, b.text, b.status)
        assert (a.stats.completion_tokens, a.stats.reasoning_tokens) == (b.stats.completion_tokens,
                                                                        b.stats.reasoning_tokens)
        assert b.stats.reasoning_estimated == think
        for result in (a, b):
            assert (result.stats.ttft_s < result.stats.ttfa_s) == think
    assert local.conversation.messages() == over_http.conversation.messages()


def run_cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "localchat", "chat", *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_a_pipe_gets_only_the_answer_in_process():
    done = run_cli("-m", "demo-think", "--think", REMEMBER)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "OK\n"
    assert " · answer " in done.stderr and " · think " in done.stderr


def test_a_pipe_gets_only_the_answer_over_the_server(think_server):
    done = run_cli("-m", "demo-think", "--backend", "server", "--base-url", think_server.base_url, "--think",
                   "--show-thinking", REMEMBER)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "OK\n"
    assert "I should reply: OK" in done.stderr and " · think ~13 · " in done.stderr


def test_think_on_a_model_without_thinking_says_it_changes_nothing():
    done = run_cli("-m", "demo", "--no-think", REMEMBER)
    assert done.returncode == 0 and done.stdout == "OK\n"
    assert "demo has no thinking mode" in done.stderr


def test_records_keep_the_reasoning_beside_the_answer(tmp_path):
    done = run_cli("-m", "demo-think", "--think", "--record", str(tmp_path), REMEMBER)
    assert done.returncode == 0, done.stderr
    response = json.loads(next(tmp_path.glob("*-response.json")).read_text())
    request = json.loads(next(tmp_path.glob("*-request.json")).read_text())
    assert (response["text"], response["reasoning"]) == ("OK", "I should reply: OK")
    assert response["stats"]["reasoning_tokens"] == 13 and response["stats"]["ttfa_s"] > response["stats"]["ttft_s"]
    assert request["params"]["think"] is True


def test_bench_think_both_reports_what_thinking_costs(tmp_path):
    from typer.testing import CliRunner

    from localchat.bench.script import SCRIPTS_DIR
    from localchat.cli.app import app

    result = CliRunner().invoke(app, ["bench", "-m", "demo-think", "--think", "both", "--history", "on",
                                      "--script", str(SCRIPTS_DIR / "recall-en.yaml"), "--format", "md",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    arms = data["summary"]["arms"]
    on, off = arms["inproc history-on think-on"], arms["inproc history-on think-off"]
    assert on["reasoning_tokens_mean"] > 0 and off["reasoning_tokens_total"] == 0
    assert on["ttfa_median_s"] > on["ttft_median_s"]
    cost = data["summary"]["think_on_vs_off"]["inproc history-on"]
    assert cost["completion_token_ratio"] > 1 and cost["reasoning_tokens_per_turn"] == on["reasoning_tokens_mean"]
    assert "thinking on vs off" in result.stdout and "TTFA med ms" in result.stdout
    rows = list(__import__("csv").DictReader((tmp_path / "turns.csv").open()))
    assert {r["think"] for r in rows} == {"True", "False"} and all(r["ttfa_s"] for r in rows)
