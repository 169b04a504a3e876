"""Every family whose real template calls tools (tests/templates), on tiny scripted weights that call
``add(a=2, b=3)`` in the family's own format and answer after its result: the whole loop in-process
and through one real mlx_lm.server, with KV reuse across the rounds and the turn kept whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from families import ADD_ARGUMENTS, FAMILIES, HERE, built
from localchat.backends import GenerationParams
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession, TurnStatus
from localchat.tools.host import ToolHost
from localchat.tools.runner import ToolRunner, approve_all
from servers import serving

TOOL_FAMILIES = [f for f in FAMILIES if f.calls]
EXAMPLE = HERE.parent / "examples" / "tools" / "add.py"
MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<arg_key>", "<|channel|>", '"name"', "<think>")


@pytest.fixture(scope="module")
def tool_dirs(smollm2) -> dict[str, Path]:
    return built(TOOL_FAMILIES, smollm2, "tool-families", tools=True)


@pytest.fixture(scope="module")
def host():
    running = ToolHost([EXAMPLE], timeout_s=10)
    yield running
    running.close()


@pytest.fixture(scope="module")
def server(tool_dirs, tmp_path_factory):
    with serving(tool_dirs["qwen2.5"], tmp_path_factory.mktemp("log"), ("--trust-remote-code",)) as running:
        yield running


def session(backend, host, approve=approve_all) -> ChatSession:
    backend.offer_tools(host.specs)
    return ChatSession(backend, Conversation.for_backend(backend, None), GenerationParams(max_tokens=64, seed=0),
                       tools=ToolRunner([host], approve))


def in_process(path: Path):
    from mlx_lm import load

    from localchat.backends.inproc import InProcessBackend

    model, tokenizer = load(str(path), trust_remote_code=True)
    return InProcessBackend(model, tokenizer, path.name)


def over_http(server, path: Path):
    from mlx_lm.utils import load_tokenizer

    from localchat.backends.openai_http import backend_for

    return backend_for(server.base_url, None, name=str(path), load_tokenizer=lambda: load_tokenizer(path))


def check_the_loop(chat: ChatSession) -> None:
    """Two questions: each calls add once, hears 5, answers; both turns kept whole in the history."""
    for _ in range(2):
        result = chat.ask("What is 2 plus 3?")
        assert result.status is TurnStatus.COMMITTED, (result.status, result.error, result.text)
        assert result.text.startswith("ok") and not any(m in result.text for m in MARKERS), result.text
        [step] = result.steps
        assert [(c["name"], c["arguments"]) for c in step.calls] == [("add", ADD_ARGUMENTS)]
        assert step.results == ("5",) and result.tool_s >= 0 and len(result.rounds) == 1
        assert result.stats.cached_tokens > 0  # the answer's round reused the calling round's prefix
    roles = [m["role"] for m in chat.conversation.history()]
    assert roles == ["user", "assistant", "tool", "assistant"] * 2
    call = chat.conversation.history()[1]["tool_calls"][0]
    assert chat.conversation.history()[2]["tool_call_id"] == call["id"] and len(call["id"]) == 9


@pytest.mark.parametrize("family", [f.name for f in TOOL_FAMILIES])
def test_the_loop_in_process(family, tool_dirs, host):
    check_the_loop(session(in_process(tool_dirs[family]), host))


@pytest.mark.parametrize("family", [f.name for f in TOOL_FAMILIES])
def test_the_loop_through_mlx_lm_server(family, tool_dirs, host, server):
    backend = over_http(server, tool_dirs[family])
    try:
        check_the_loop(session(backend, host))
    finally:
        backend.close()


def test_ctrl_c_while_a_tool_runs_leaves_the_history_as_it_was(tool_dirs, host):
    def interrupted(name, arguments):
        raise KeyboardInterrupt

    chat = session(in_process(tool_dirs["qwen2.5"]), host)
    assert chat.ask("What is 2 plus 3?").committed
    before = list(chat.conversation.turns)
    chat.tools = ToolRunner([host], interrupted)
    result = chat.ask("What is 2 plus 3?")
    assert result.status is TurnStatus.INTERRUPTED and chat.conversation.turns == before


def test_a_refused_call_is_what_the_model_hears_and_the_turn_still_answers(tool_dirs, host):
    chat = session(in_process(tool_dirs["llama3"]), host, approve=lambda name, arguments: "refused: not today")
    result = chat.ask("What is 2 plus 3?")
    assert result.committed and result.steps[0].results == ("refused: not today",)
    assert chat.conversation.history()[2]["content"] == "refused: not today"


def test_demo_tools_calls_add_once_and_prints_the_answer_alone_in_process_and_through_the_server(server, tmp_path,
                                                                                                 monkeypatch):
    """The issue's "done when", on the shipped sibling: the pipe gets the answer alone, stderr the one call."""
    from typer.testing import CliRunner

    from localchat.cli.app import app

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    for backend in ([], ["--backend", "server", "--base-url", server.base_url]):
        for question, answer, call in (("What is 2 plus 3?", "The answer is 5.", '→ add({"a": 2, "b": 3})'),
                                       ("12 加 30 等于多少？", "答案是 42。", '→ add({"a": 12, "b": 30})')):
            done = CliRunner().invoke(app, ["chat", "-m", "demo-tools", *backend, "--tools", str(EXAMPLE),
                                            "--approve-tools", question])
            assert done.exit_code == 0, done.stderr
            assert done.stdout == answer + "\n"
            assert done.stderr.count("→ add(") == 1 and call in done.stderr and "rounds 2" in done.stderr
