"""The thinking budget: what it forces (units), demo-think in-process and through ``serve`` (chat
completions, Anthropic Messages with ``budget_tokens``, Responses with ``effort``), two budgets in
one batch, nonsense refused, and every reasoning family's own end of reasoning."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys

import anthropic
import httpx
import mlx.core as mx
import openai
import pytest

from localchat.backends import Finished, GenerationParams, ReasoningChunk, TextChunk
from localchat.grammar.think_budget import (
    BudgetedReasoning,
    ReasoningCounter,
    ThinkBudget,
    forced_ending,
    parse_budget,
)
from localchat.serve.started import StartedServe
from localchat.templates.reasoning_formats import harmony, think_markers

QUESTION = "Remember the code harbor 17. What is the code?"
MESSAGES = [{"role": "user", "content": QUESTION}]


@pytest.mark.parametrize("value", [-1, "lots", "4.5", 10**7, True, "²", [4]])
def test_nonsense_budgets_are_one_clear_error(value):
    with pytest.raises(ValueError) as refused:
        parse_budget(value)
    assert "think budget" in str(refused.value) and "\n" not in str(refused.value)


def test_a_budget_is_a_whole_number_or_none():
    assert parse_budget("16") == 16 and parse_budget(0) == 0
    assert parse_budget("none") is None and parse_budget(None) is None


def test_each_family_ends_its_reasoning_its_own_way():
    assert forced_ending(think_markers(), "") == "</think>"
    assert forced_ending(think_markers(), "Time to answer.") == "Time to answer.\n</think>"
    assert forced_ending(harmony(), "") == "<|end|><|start|>assistant<|channel|>final<|message|>"


def test_the_processor_forces_the_ending_once_the_reasoning_holds_the_budget():
    opener, closer, ending = (100,), (101,), (7, 101)
    processor = BudgetedReasoning(3, ReasoningCounter(opener, closer, inside=False), ending)
    logits = mx.zeros((1, 128))
    picked = []
    context = [1, 2]  # the prompt
    for sampled in (100, 5, 6, None, None, 9):  # the model opens, thinks 2 tokens; then the forced ones
        out = processor(mx.array(context), logits)
        forced = int(mx.argmax(out, axis=-1).item()) if mx.isinf(out).any().item() else None
        token = forced if forced is not None else sampled
        picked.append(token)
        context.append(token)
    assert picked[:5] == [100, 5, 6, 7, 101] and processor.cut and processor.counter.count == 5
    assert not mx.isinf(processor(mx.array(context), logits)).any().item()  # the answer decodes freely


# --- demo-think in-process ---------------------------------------------------------------------------


def reply(backend, budget: int | None):
    backend.close()  # (each reply from a fresh cache)
    events = list(backend.stream(MESSAGES, GenerationParams(
        max_tokens=48, think_budget=ThinkBudget(tokens=budget) if budget is not None else None)))
    done = next(e for e in events if isinstance(e, Finished))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningChunk))
    answer = "".join(e.text for e in events if isinstance(e, TextChunk))
    return reasoning, answer, done


@pytest.fixture(scope="module")
def think_backend():
    from localchat.backends.inproc import load_inproc
    from localchat.registry import local_dir, resolve

    ref = resolve("demo-think")
    return load_inproc(ref, local_dir(ref))


def test_a_budget_below_the_reasoning_cuts_it_there_and_the_answer_follows(think_backend):
    tokenizer = think_backend.tokenizer
    free_reasoning, free_answer, free = reply(think_backend, None)
    reasoning, answer, done = reply(think_backend, 4)
    opener = len(tokenizer.encode("<think>", add_special_tokens=False))
    assert len(tokenizer.encode(reasoning, add_special_tokens=False)) + opener == 4  # the budget, markers included
    assert done.reasoning_cut and done.reasoning_tokens == 4 + 1  # and the forced </think>
    assert answer and free_reasoning.startswith(reasoning) and len(reasoning) < len(free_reasoning)
    assert free.reasoning_tokens > done.reasoning_tokens and not free.reasoning_cut


def test_a_budget_above_the_reasoning_changes_nothing(think_backend):
    assert reply(think_backend, 1000)[:2] == reply(think_backend, None)[:2]
    assert not reply(think_backend, 1000)[2].reasoning_cut


def test_a_budget_of_0_answers_at_once(think_backend):
    reasoning, answer, done = reply(think_backend, 0)
    assert reasoning == "" and answer and done.reasoning_cut and done.reasoning_tokens == 2  # <think></think>


def test_chat_shows_the_cut_on_the_figures_line(tmp_path):
    import json

    done = subprocess.run([sys.executable, "-m", "localchat", "chat", "-m", "demo-think", "--think-budget", "4",
                           "--show-thinking", "--record", str(tmp_path / "records"), QUESTION], capture_output=True,
                          text=True, timeout=120, env=os.environ | {"LOCALCHAT_HOME": str(tmp_path), "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "think 5 (cut at the budget)" in done.stderr
    response = json.loads(next((tmp_path / "records").glob("*-response.json")).read_text())
    assert response["stats"]["reasoning_cut"] is True  # the record says so, as the saved turn's figures do
    refused = subprocess.run([sys.executable, "-m", "localchat", "chat", "-m", "demo-think", "--think-budget", "-2",
                              QUESTION], capture_output=True, text=True, timeout=60,
                             env=os.environ | {"LOCALCHAT_HOME": str(tmp_path)})
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr


# --- through serve -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    serve = StartedServe(tmp_path_factory.mktemp("budget") / "home", "-m", "demo-think", "--api",
                         "anthropic,responses")
    assert serve.wait_ready(), serve.out
    yield serve
    serve.stop()


def completion(serve, budget=None, **fields):
    body = {"model": "demo-think", "messages": MESSAGES, "max_tokens": 40, **fields}
    if budget is not None:
        body["think_budget"] = budget
    return httpx.post(serve.url + "/v1/chat/completions", json=body, timeout=120)


def test_chat_completions_take_a_budget_and_say_it_was_cut(served, think_backend):
    tokenizer = think_backend.tokenizer
    free, cut, above = completion(served).json(), completion(served, 4).json(), completion(served, 1000).json()
    reasoning = cut["choices"][0]["message"]["reasoning"]
    assert len(tokenizer.encode(reasoning, add_special_tokens=False)) + 1 == 4
    assert cut["usage"]["think_budget"] == {"tokens": 4, "cut": True} and cut["choices"][0]["message"]["content"]
    assert above["choices"][0]["message"] == free["choices"][0]["message"]  # above the reasoning: as without
    assert above["usage"]["think_budget"] == {"tokens": 1000, "cut": False} and "think_budget" not in free["usage"]


def test_two_requests_in_one_batch_each_get_their_own_budget(served):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        cut, free = pool.map(lambda b: completion(served, b, max_tokens=200).json(), (4, 1000))
    assert cut["usage"]["think_budget"]["cut"] and not free["usage"]["think_budget"]["cut"]
    assert len(free["choices"][0]["message"]["reasoning"]) > len(cut["choices"][0]["message"]["reasoning"])


@pytest.mark.parametrize("field,value", [("think_budget", -1), ("think_budget", "soon"), ("think_budget", 10**9),
                                         ("reasoning_effort", "extreme"), ("think_budget_message", "\x1b[2J")])
def test_nonsense_is_a_400_in_openais_shape(served, field, value):
    refused = httpx.post(served.url + "/v1/chat/completions", timeout=60,
                         json={"model": "demo-think", "messages": MESSAGES, "max_tokens": 8, field: value})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["type"] == "invalid_request_error" and "\n" not in error["message"]


def test_anthropic_budget_tokens_bound_the_thinking_block(served, think_backend):
    client = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0)
    message = client.messages.create(model="m", max_tokens=40, messages=MESSAGES,
                                     thinking={"type": "enabled", "budget_tokens": 8})
    thinking = next(b.thinking for b in message.content if b.type == "thinking")
    assert 0 < len(think_backend.tokenizer.encode(thinking, add_special_tokens=False)) <= 8
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="m", max_tokens=40, messages=MESSAGES,
                               thinking={"type": "enabled", "budget_tokens": "many"})
    assert "budget_tokens" in str(refused.value)


def test_responses_effort_minimal_answers_without_reasoning(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0)
    minimal = client.responses.create(model="m", input=QUESTION, reasoning={"effort": "minimal"},
                                      max_output_tokens=40)
    high = client.responses.create(model="m", input=QUESTION, reasoning={"effort": "high"}, max_output_tokens=40)
    assert [i.type for i in minimal.output] == ["message"] and minimal.output_text
    assert "reasoning" in [i.type for i in high.output]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input=QUESTION, reasoning={"effort": "enormous"}, max_output_tokens=8)


def test_serve_think_budget_is_each_requests_default(tmp_path):
    serve = StartedServe(tmp_path / "home", "-m", "demo-think", "--think-budget", "0")
    try:
        assert serve.wait_ready(), serve.out
        by_default, own = completion(serve).json(), completion(serve, "none").json()
        assert by_default["usage"]["think_budget"] == {"tokens": 0, "cut": True}
        assert own["choices"][0]["message"].get("reasoning")  # a request's own field wins
    finally:
        serve.stop()


# --- bench and the command line ---------------------------------------------------------------------


def test_bench_puts_budgets_side_by_side_and_a_cut_mid_reasoning_costs_the_toy_its_answers(tmp_path):
    import json

    from typer.testing import CliRunner

    from localchat.bench.script import SCRIPTS_DIR
    from localchat.cli.app import app

    done = CliRunner().invoke(app, ["bench", "--format", "json", "-m", "demo-think", "--history", "on",
                                    "--script", str(SCRIPTS_DIR / "recall-en.yaml"), "--think-budget", "0,8,none"],
                              env={"LOCALCHAT_HOME": str(tmp_path)})
    assert done.exit_code == 0, done.stdout + done.stderr
    budgets = json.loads(done.stdout)["summary"]["think_budget_vs_none"]
    zero, eight = budgets["inproc history-on budget-0"], budgets["inproc history-on budget-8"]
    assert zero["cut_share"] == 1.0 and zero["reasoning_tokens_per_turn"] == 2.0  # <think></think>
    assert eight["accuracy_difference"] < 0 and eight["against"] == "inproc history-on"
    assert zero["ttfa_ratio"] < 1  # no reasoning to wait for


@pytest.mark.parametrize("args,needle", [
    (["bench", "--think-budget", "0,0"], "each budget once"),
    (["bench", "--think-budget", "4,,8"], "comma-separated"),
    (["bench", "--think-budget", "-4"], "from 0 to"),
    (["serve", "--plain", "--think-budget", "4"], "leave out --plain"),
    (["serve", "--think-budget", "many"], "whole number"),
    (["chat", "-m", "demo-think", "--draft-model", "demo-think", "--think-budget", "4", "hi"], "cannot go together"),
])
def test_nonsense_on_the_command_line_is_one_usage_line(args, needle, tmp_path):
    done = subprocess.run([sys.executable, "-m", "localchat", *args], capture_output=True, text=True, timeout=60,
                          env=os.environ | {"LOCALCHAT_HOME": str(tmp_path), "COLUMNS": "200"})
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
