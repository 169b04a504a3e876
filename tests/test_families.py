"""The model families users run: every real chat template (tests/templates/SOURCES.md), on a real
tokenizer with tiny scripted weights (tests/families.py), in-process and through one real
mlx_lm.server, checked as a matrix: family × (single prompt, system, history, think, KV reuse,
server). Each family's conversations run once (``runs``); the checks read what they recorded.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from families import FAMILIES, built
from localchat.backends import GenerationParams
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession, TurnResult, TurnStatus
from servers import serving

SYSTEM = "Be brief."
QUESTIONS = ("hello", "how are you", "bye")
MARKERS = re.compile(r"<think>|</think>|<\|channel\|>|<\|message\|>|<\|end\|>|<\|start\|>|plan")
CHECKS = ("single", "system", "history", "think", "kv_reuse", "server")


@pytest.fixture(scope="module")
def family_dirs(smollm2) -> dict[str, Path]:
    """Every family's model directory, built once per machine (keyed by what it is made of)."""
    return built(FAMILIES, smollm2, "families")


@pytest.fixture(scope="module")
def server(family_dirs, tmp_path_factory):
    """One real mlx_lm.server for every family: each request names its model directory."""
    with serving(family_dirs["smollm2"], tmp_path_factory.mktemp("log"), ("--trust-remote-code",)) as running:
        yield running


@dataclass
class FamilyRun:
    """What one family's conversations did, in-process (with and without KV reuse) and over HTTP."""

    single: TurnResult
    system: list[TurnResult]
    sent: list[tuple[list[int], list[int]]]  # per turn: the prompt localchat fed, apply_chat_template(/history)
    history: list[dict] = field(default_factory=list)
    think: dict = field(default_factory=dict)  # think setting → (results, history)
    no_reuse: list[TurnResult] = field(default_factory=list)
    server: list[TurnResult] = field(default_factory=list)
    traits: object = None


def loader(path: Path):
    """Backends of the family's model, loaded once (each backend keeps its own KV cache)."""
    from mlx_lm import load

    from localchat.backends.inproc import InProcessBackend

    model, tokenizer = load(str(path), trust_remote_code=True)
    return lambda cache_reuse=True: InProcessBackend(model, tokenizer, path.name, cache_reuse=cache_reuse)


def chat(backend, think=None, system=SYSTEM, seed=None) -> ChatSession:
    return ChatSession(backend, Conversation.for_backend(backend, system),
                       GenerationParams(max_tokens=48, think=think, seed=seed))


def three_turns(session: ChatSession) -> tuple[list[TurnResult], list[tuple[list[int], list[int]]]]:
    """Three turns; for each, the prompt fed to the model and the template applied to what /preview
    shows (which, after the first turn, is what /history shows and the new question)."""
    results, sent = [], []
    tokenizer = session.backend.tokenizer
    for question in QUESTIONS:
        shown = session.preview(question)
        if session.conversation.turns:
            assert shown == session.conversation.messages() + [{"role": "user", "content": question}]
        expected = tokenizer.apply_chat_template(shown, add_generation_prompt=True,
                                                 **session.backend.template.kwargs(session.params.think))
        results.append(session.ask(question))
        sent.append((session.backend.cached_ids[:len(expected)], list(expected)))
    return results, sent


_RUNS: dict[str, FamilyRun] = {}


@pytest.fixture(scope="module")
def runs(family_dirs, server):
    from localchat.backends.openai_http import backend_for

    def run(name: str) -> FamilyRun:
        if name not in _RUNS:
            path = family_dirs[name]
            in_process = loader(path)
            backend = in_process()
            single = chat(backend, system=None).ask("hello")
            backend.close()
            session = chat(backend)
            system, sent = three_turns(session)
            done = FamilyRun(single=single, system=system, sent=sent, history=session.conversation.history(),
                             traits=backend.template.traits)
            for think in (True, False):
                thinking = chat(in_process(), think=think)
                done.think[think] = ([thinking.ask(q) for q in QUESTIONS[:2]], thinking.conversation.history())
            done.no_reuse = _replay(in_process(cache_reuse=False))
            over_http = backend_for(server.base_url, None, name=str(path),
                                    load_tokenizer=lambda: probed_tokenizer(path))  # (only read: one load a family)
            done.server = _replay_session(chat(over_http, seed=0))
            over_http.close()
            _RUNS[name] = done
        return _RUNS[name]

    return run


def _replay(backend) -> list[TurnResult]:
    return _replay_session(chat(backend))


def _replay_session(session: ChatSession) -> list[TurnResult]:
    return [session.ask(q) for q in QUESTIONS]


def clean(result: TurnResult) -> bool:
    """Committed, an answer that starts as the script says, and no reasoning or marker in it."""
    return result.status is TurnStatus.COMMITTED and result.text.startswith("ok") and not MARKERS.search(result.text)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("family", [f.name for f in FAMILIES])
def test_family(family, check, runs):
    done = runs(family)
    if check == "single":
        assert clean(done.single), done.single
        assert done.single.messages[-1] == {"role": "user", "content": "hello"}
    elif check == "system":
        first = done.system[0].messages
        assert clean(done.system[0]), done.system[0]
        if done.traits.fold_system:
            assert first[0] == {"role": "user", "content": f"{SYSTEM}\n\nhello"}
        else:
            assert first[0] == {"role": "system", "content": SYSTEM}
    elif check == "history":
        assert all(clean(r) for r in done.system), done.system
        for fed, expected in done.sent:
            assert fed == expected  # what localchat sends is the template applied to what /history shows
        assert [m["content"] for m in done.history if m["role"] == "assistant"] == [r.text for r in done.system]
    elif check == "think":
        check_think(done)
    elif check == "kv_reuse":
        assert [r.text for r in done.system] == [r.text for r in done.no_reuse]
        if not done.traits.system_moves:
            assert done.system[2].stats.cached_tokens > done.system[1].stats.cached_tokens > 0
    elif check == "server":
        assert [(r.text, r.reasoning, r.status) for r in done.server] == \
            [(r.text, r.reasoning, r.status) for r in done.system]
        assert [r.stats.prompt_tokens for r in done.server] == [r.stats.prompt_tokens for r in done.system]


def check_think(done: FamilyRun) -> None:
    """Reasoning never in the answer, never in history unless the template reads it; --no-think
    answers directly wherever the template has a switch that allows it."""
    traits = done.traits
    for think, (results, history) in done.think.items():
        assert all(clean(r) for r in results), results
        reasons = [r.reasoning for r in results]
        expected = "plan" if traits.reasoning and (think or traits.always_thinks or
                                                   traits.think_switch == "reasoning_effort") else ""
        assert reasons == [expected] * len(results), (think, reasons)
        for message in (m for m in history if m["role"] == "assistant"):
            assert not MARKERS.search(message["content"])
            assert (traits.reasoning_field in message) == bool(traits.reasoning_field and expected)


def test_the_matrix_covers_every_registry_family():
    """Vision models' templates are mlx-vlm's to render (tests/test_vision.py runs the toy)."""
    from localchat.registry import load_registry, models_file

    families = {f.name for f in FAMILIES}
    entries = load_registry(models_file())
    assert {entry.family for entry in entries if not entry.vision} <= families
    assert {entry.family for entry in entries if entry.vision} == {"vision"}
    assert len([f for f in FAMILIES if f.template]) >= 12


# --- the CLI a user runs, over the same server ----------------------------------------------------------

def cli(server, path, *args, stdin=None):
    from localchat.cli.app import app

    return CliRunner().invoke(app, ["chat", "--backend", "server", "--base-url", server.base_url, "-m", str(path),
                                    *args], input=stdin)


def test_gemma2_with_a_system_message_answers_and_says_once_it_was_folded(server, family_dirs, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    done = cli(server, family_dirs["gemma2"], "--system", SYSTEM, stdin="hello\nhow are you\n/history\n")
    assert done.exit_code == 0, done.output
    assert done.stderr.count("folded into the first user message") == 1
    assert done.stdout.count("ok") == 2
    assert f"user: {SYSTEM}\n\n     hello" in done.stderr  # later lines indented under the first


def test_gpt_oss_shows_only_answers_with_reasoning_counted_apart(server, family_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    done = cli(server, family_dirs["gpt-oss"], stdin="\n".join(QUESTIONS) + "\n")
    assert done.exit_code == 0, done.output
    answers = [line.removeprefix(">>> ") for line in done.stdout.splitlines() if line.strip(" >")]  # input()'s prompt
    assert len(answers) == 3 and all(a.startswith("ok") and not MARKERS.search(a) for a in answers)
    assert done.stderr.count(" · think ~") == 3  # reasoning counted, apart, on every turn


def test_a_server_that_refuses_the_system_role_is_explained(server, family_dirs):
    from localchat.backends.openai_http import backend_for

    backend = backend_for(server.base_url, None, name=str(family_dirs["gemma2"]))  # no local template
    result = chat(backend).ask("hello")
    assert result.status is TurnStatus.ERROR
    assert "refuses a system message (System role not supported)" in result.error and "--system ''" in result.error


def test_harmony_in_content_is_split_without_a_local_template(server, family_dirs):
    from localchat.backends.openai_http import backend_for

    backend = backend_for(server.base_url, None, name=str(family_dirs["gpt-oss"]))
    results = _replay_session(chat(backend, seed=0))
    assert all(clean(r) and r.reasoning == "plan" for r in results), results


def test_template_errors_are_one_line_everywhere(family_dirs, tmp_path):
    """A template that raises while tokens are counted for trimming: an error turn, history intact."""
    from mlx_lm import load

    from localchat.backends.inproc import InProcessBackend
    from localchat.conversation.settings import TrimPolicy

    model, tokenizer = load(str(family_dirs["qwen2.5"]), trust_remote_code=True)
    tokenizer._tokenizer.chat_template = "{{ raise_exception('no thanks') }}"
    backend = InProcessBackend(model, tokenizer, "broken")
    session = ChatSession(backend, Conversation("sys"), GenerationParams(max_tokens=8),
                          trim=TrimPolicy(max_context_tokens=100))
    result = session.ask("hello")
    assert (
        result.status is TurnStatus.ERROR
        and result.error == "broken's chat template: it refused these messages: no thanks"
    )
    assert session.conversation.turns == []
    assert json.dumps(result.messages) == "[]"


# What each template needed: the probe's findings, family by family (the closing note's table).
TRAITS = {  # fold system, system moves, reasoning field, reasoning format, think switch, always thinks
    "smollm2": (False, False, None, None, None, False),
    "demo": (False, False, None, None, None, False),
    "demo-think": (False, False, None, "think", "enable_thinking", False),
    "qwen3": (False, False, "reasoning_content", "think", "enable_thinking", False),
    "qwen2.5": (False, False, None, None, None, False),
    "llama3": (False, False, None, None, None, False),
    "gemma2": (True, False, None, None, None, False),
    "gemma3": (False, False, None, None, None, False),
    "mistral-v0.2": (True, False, None, None, None, False),
    "mistral-v0.3": (False, True, None, None, None, False),
    "mistral-nemo": (False, True, None, None, None, False),
    "phi3.5": (False, False, None, None, None, False),
    "deepseek-r1": (False, False, None, "think", None, True),
    "gpt-oss": (False, False, "thinking", "harmony", "reasoning_effort", False),
    "smollm3": (False, False, None, "think", "enable_thinking", False),
    "glm": (False, False, "reasoning_content", "think", "enable_thinking", False),
}


@functools.cache
def probed_tokenizer(path: Path):
    """A family's tokenizer for the probes, which only read it: loaded once (its tokenizer.json is
    SmolLM2's, 3.5 MB of JSON to parse for each load)."""
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(path)


@pytest.mark.parametrize("family", [f.name for f in FAMILIES])
def test_the_probe_finds_what_each_template_needs(family, family_dirs):
    from localchat.templates.render import ChatTemplate

    traits = ChatTemplate(probed_tokenizer(family_dirs[family]), family).traits
    found = (traits.fold_system, traits.system_moves, traits.reasoning_field,
             traits.reasoning.name if traits.reasoning else None, traits.think_switch, traits.always_thinks)
    assert found == TRAITS[family]


TOOLS = {"qwen3": "markers", "qwen2.5": "markers", "llama3": "json", "mistral-v0.3": "markers",  # how calls are read
         "mistral-nemo": "markers", "gpt-oss": "harmony", "glm": "markers"}  # every other family: no tool support


@pytest.mark.parametrize("family", [f.name for f in FAMILIES])
def test_the_probe_finds_whether_and_how_each_template_calls_tools(family, family_dirs):
    from localchat.errors import UsageError
    from localchat.templates.render import ChatTemplate, check_tool_support

    template = ChatTemplate(probed_tokenizer(family_dirs[family]), family)
    traits = template.traits
    assert (traits.tool_format.name if traits.tool_format else None) == TOOLS.get(family)
    assert traits.takes_tools == (family in TOOLS)
    if family not in TOOLS:
        with pytest.raises(UsageError, match=f"{family}'s chat template has no tool support"):
            check_tool_support(template, family)


def test_notices_say_what_the_switches_do(family_dirs):
    from localchat.templates.render import ChatTemplate

    def said(family, **kwargs):
        return " | ".join(ChatTemplate(probed_tokenizer(family_dirs[family]), family).traits.notices(family, **kwargs))

    assert "always opens its think block: --no-think changes nothing" in said("deepseek-r1", system=False, think=False)
    assert "--think sets reasoning_effort to high" in said("gpt-oss", system=False, think=True)
    assert "moves the system message into the last user turn" in said("mistral-v0.3", system=True, think=None)
    assert "has no thinking mode" in said("llama3", system=False, think=True)
    assert said("qwen3", system=True, think=False) == ""


def test_an_answer_the_template_would_refuse_in_history_is_not_committed(family_dirs):
    from mlx_lm import load

    from localchat.backends.inproc import InProcessBackend

    model, tokenizer = load(str(family_dirs["qwen2.5"]), trust_remote_code=True)
    tokenizer._tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'assistant' and m.content.startswith('ok') %}"
        "{{ raise_exception('answers may not start with ok') }}{% endif %}"
        "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    session = chat(InProcessBackend(model, tokenizer, "strict"))
    result = session.ask("hello")
    assert result.text.startswith("ok") and result.status is TurnStatus.UNRENDERABLE
    assert result.error == "strict's chat template: it refused these messages: answers may not start with ok"
    assert session.conversation.turns == []


def test_preview_reports_a_template_error_in_one_line(family_dirs):
    import io

    from mlx_lm import load
    from rich.console import Console

    from localchat.backends.inproc import InProcessBackend
    from localchat.cli.render import ChatUI
    from localchat.cli.repl import Repl

    model, tokenizer = load(str(family_dirs["qwen2.5"]), trust_remote_code=True)
    tokenizer._tokenizer.chat_template = "{% for m in messages %}{{ m.content + 1 }}{% endfor %}"
    err = io.StringIO()
    repl = Repl(chat(InProcessBackend(model, tokenizer, "odd")), ChatUI(out=io.StringIO(), err=Console(file=err)))
    assert repl.handle("/preview hello") is True
    assert (
        err.getvalue().strip()
        == 'error: odd\'s chat template: it failed: TypeError: can only concatenate str (not "int") to str'
    )


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.reasoning], ids=lambda f: f.name)
def test_a_thinking_budget_ends_each_familys_reasoning_its_own_way(family, family_dirs):
    """Budget 0 with thinking on: the family's own end of reasoning is forced (``</think>``, or
    harmony's end of analysis and head of final), nothing of it reaches the answer, the answer follows."""
    from localchat.backends import Finished, ReasoningChunk, TextChunk
    from localchat.grammar.think_budget import ThinkBudget

    backend = loader(family_dirs[family.name])()
    events = list(backend.stream([{"role": "user", "content": "alpha"}],
                                 GenerationParams(max_tokens=24, think=True, think_budget=ThinkBudget(tokens=0))))
    done = next(e for e in events if isinstance(e, Finished))
    answer = "".join(e.text for e in events if isinstance(e, TextChunk))
    assert done.reasoning_cut and "plan" not in "".join(e.text for e in events if isinstance(e, ReasoningChunk))
    assert answer and not MARKERS.search(answer), answer
