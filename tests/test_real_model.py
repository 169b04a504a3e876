"""SmolLM2-135M-Instruct (a real chat model, real tokenizer, real template) through localchat:
in-process and through mlx_lm.server, parity, KV reuse and JSON mode. Short prompts, few tokens:
this CPU decodes it at ~9 tok/s."""

import json

import pytest
from typer.testing import CliRunner

from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend
from localchat.backends.openai_http import backend_for
from localchat.cli.app import app
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession, TurnStatus
from localchat.registry import ModelRef
from localchat.server.launch import free_port, start_ready
from localchat.server.parity import compare

runner = CliRunner()
GREEDY = GenerationParams(temperature=0.0, max_tokens=8)  # (SmolLM2 prefills and decodes at ~7-10 tok/s here)
TURNS = ("What is the capital of France?", "And of Italy?", "Thanks!")


@pytest.fixture(scope="module")
def loaded(smollm2):
    from mlx_lm import load

    return load(str(smollm2))


def backend(loaded, reuse=True) -> InProcessBackend:
    model, tokenizer = loaded
    return InProcessBackend(model, tokenizer, "smollm2", cache_reuse=reuse)


def play(b) -> list:
    session = ChatSession(b, Conversation(None), GREEDY)
    return [session.ask(t) for t in TURNS]


@pytest.fixture(scope="module")
def played(loaded) -> list:
    """The three turns in-process with KV reuse, played once for the tests that compare against them."""
    return play(backend(loaded))


def test_smollm2_needs_no_import_step(tmp_path, monkeypatch):
    """``chat -m smollm2`` answers from the command line, importing the packaged GGUF the first time only."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    result = runner.invoke(app, ["chat", "-m", "smollm2", "--max-tokens", "8", "What is the capital of France?"])
    assert result.exit_code == 0, result.stderr
    assert "Paris" in result.stdout and (tmp_path / "models" / "smollm2" / "config.json").is_file()
    assert "imported smollm2 from its package into" in result.stderr  # (said: first use, or again after rm)
    again = runner.invoke(app, ["chat", "-m", "smollm2", "--max-tokens", "1", "Hi"])
    assert again.exit_code == 0 and "imported" not in again.stderr


def test_the_templates_own_system_prompt_is_used_when_the_registry_sends_none(loaded):
    b = backend(loaded)
    messages = Conversation(None).preview("Hi")
    assert messages == [{"role": "user", "content": "Hi"}]
    rendered = b.tokenizer.decode(b.encode(messages))
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_kv_reuse_is_token_identical_to_re_prefilling_over_three_turns(loaded, played):
    with_reuse, without = played, play(backend(loaded, reuse=False))
    assert [r.text for r in with_reuse] == [r.text for r in without]
    assert [r.stats.prompt_tokens for r in with_reuse] == [r.stats.prompt_tokens for r in without]
    assert all(r.stats.cached_tokens == 0 for r in without)
    reused = [r.stats.cached_tokens for r in with_reuse[1:]]
    assert all(c > 0 for c in reused)
    # a reply that re-tokenizes differently once templated is re-prefilled, and that is counted
    for r, previous in zip(with_reuse[1:], with_reuse):
        assert r.stats.cached_tokens + r.stats.cache_miss_tokens >= previous.stats.prompt_tokens


def test_parity_in_process_against_mlx_lm_server(loaded, played, smollm2):
    ref = ModelRef("smollm2", str(smollm2), "local")
    inproc = played
    server = start_ready(ref, port=free_port())
    try:
        http = backend_for(server.base_url, ref)
        served = play(http)
        http.close()
    finally:
        server.stop()
    report = compare("smollm2", inproc, served, loaded[1])
    assert report.ok, report.first_difference
    assert all(r.status in (TurnStatus.COMMITTED, TurnStatus.CUT) for r in served)
    assert not any(r.stats.estimated for r in served)


def test_json_mode_sends_the_instruction_and_judges_the_reply(smollm2, tmp_path):
    result = runner.invoke(app, ["chat", "-m", str(smollm2), "--json", "--max-tokens", "16", "--record",
                                 str(tmp_path), "Say hello."])
    request = json.loads(next(tmp_path.glob("*-request.json")).read_text())
    response = json.loads(next(tmp_path.glob("*-response.json")).read_text())
    assert request["messages"][0]["content"].endswith('Answer in JSON: {"answer": "..."}')
    assert response["status"] in ("committed", "invalid-json", "cut")
    assert result.exit_code == (1 if response["status"] in ("invalid-json", "cut") else 0)  # cut: no valid answer
    if response["status"] == "committed":
        assert isinstance(json.loads(result.stdout)["answer"], str)


def test_the_repl_keeps_a_real_reply_and_sends_no_system_message(smollm2, tmp_path):
    result = runner.invoke(app, ["chat", "-m", str(smollm2), "--max-tokens", "12", "--record", str(tmp_path)],
                           input="What is the capital of France?\n/history\n/quit\n")
    assert result.exit_code == 0, result.stderr
    assert "Paris" in result.stdout
    assert "history: 2 messages" in result.stderr and "system:" not in result.stderr
    request = json.loads(next(tmp_path.glob("*-request.json")).read_text())
    assert [m["role"] for m in request["messages"]] == ["user"]  # the template adds SmolLM's own
