"""Long conversations: big-step trimming that keeps the KV cache, the context gauge, summary
compaction (a model call like any turn), pinned facts, saved with the session; through the demo
model in-process, a scripted server, and a real mlx_lm.server."""

from __future__ import annotations

import io
import json
import statistics

import httpx
import pytest
from rich.console import Console

from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend
from localchat.backends.openai_http import ServerBackend
from localchat.cli.render import ChatUI
from localchat.cli.repl import Repl
from localchat.conversation.compaction import SUMMARY_PROMPT, CompactionPolicy, compact
from localchat.conversation.history import Conversation, Turn
from localchat.conversation.records import TurnRecorder
from localchat.conversation.settings import TrimPolicy
from localchat.conversation.stats import stats_line
from localchat.conversation.turn import ChatSession, TurnStatus

SYSTEM = "You are a helpful assistant."
REMEMBER = "Remember the code harbor 17. Reply only OK."
RECALL = "What was the code? Reply with the code only."
SMALL_TALK = ["Hello", "How are you?", "Thanks", "Good morning", "Nice weather today.", "Tell me a joke."]
NOTES = "Notes: the code is harbor 17."


def demo_chat(demo, budget=None, trim_to=0.5, compaction=None) -> ChatSession:
    model, tokenizer = demo
    return ChatSession(InProcessBackend(model, tokenizer, "demo"), Conversation(SYSTEM),
                       GenerationParams(max_tokens=32),
                       trim=TrimPolicy(max_context_tokens=budget, trim_to=trim_to), compaction=compaction)


# --- big steps --------------------------------------------------------------------------------------

def prefilled_after_first_trim(demo, trim_to: float) -> list[int]:
    chat = demo_chat(demo, budget=200, trim_to=trim_to)
    results = [chat.ask(q) for q in [REMEMBER] + SMALL_TALK * 4]
    first = next(i for i, r in enumerate(results) if r.dropped_turns)
    assert all(r.stats.prompt_tokens <= 200 for r in results)
    return [r.stats.prompt_tokens - r.stats.cached_tokens for r in results[first:]]


def test_trimming_in_big_steps_keeps_reusing_the_cache_between_trims(demo):
    one_at_a_time, big_steps = prefilled_after_first_trim(demo, 1.0), prefilled_after_first_trim(demo, 0.5)
    assert min(one_at_a_time) > 100  # every turn drops one and re-prefills the budget
    assert sum(p < 40 for p in big_steps) > len(big_steps) / 2  # most turns reuse the cache
    assert statistics.fmean(big_steps) <= 0.5 * statistics.fmean(one_at_a_time)


def test_a_big_step_drops_the_fewest_turns_that_reach_the_low_water_mark():
    conversation = Conversation("S" * 10, [Turn("u" * 10, "a" * 10) for _ in range(30)])
    count = lambda messages: sum(len(m["content"]) for m in messages)  # noqa: E731  (a character "token")
    assert conversation.plan_trim("q" * 10, max_tokens=700, count_tokens=count) == 0  # 620 fits
    drop = conversation.plan_trim("q" * 10, max_tokens=500, count_tokens=count, low_water=0.5)
    kept, one_fewer = (count(conversation.preview("q" * 10, drop=n)) for n in (drop, drop - 1))
    assert kept <= 250 < one_fewer
    assert conversation.plan_trim("q" * 10, max_tokens=500, count_tokens=count, low_water=1.0) == 6  # one at a time


def test_max_turns_keeps_its_exact_meaning(demo):
    chat = demo_chat(demo)
    chat.trim = TrimPolicy(max_turns=2)
    result = [chat.ask(q) for q in SMALL_TALK[:4]][-1]
    assert result.dropped_turns == 1 and len(result.messages) == 1 + 2 * 2 + 1


# --- the gauge ----------------------------------------------------------------------------------------

def test_the_gauge_is_the_counted_prompt_over_the_budget(demo):
    chat = demo_chat(demo, budget=300)
    result = chat.ask(REMEMBER)
    counted = chat.count(result.messages)
    assert result.stats.budget_tokens == 300 and result.stats.prompt_tokens == counted
    assert result.stats.context_share == counted / 300
    assert f" · ctx {round(100 * counted / 300)} % · " in stats_line(result.stats)
    window = demo_chat(demo).ask(REMEMBER).stats  # no budget of the user's: the model's window less the reply
    assert window.budget_tokens == 1024 - 32


# --- compaction through a scripted server ---------------------------------------------------------------

def scripted_server(demo, summary: dict | BaseException | None = None, seen: list | None = None) -> ServerBackend:
    """Answers ``OK`` to every question and ``summary`` (a chunk's delta and finish reason, or an
    exception to raise while streaming) to a request for notes; token counts by the demo tokenizer."""
    summary = summary if summary is not None else {"delta": {"content": NOTES}, "finish": "stop"}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(404)
        body = json.loads(request.content)
        (seen if seen is not None else []).append(body)
        asked = body["messages"][-1]["content"]
        if asked.startswith(SUMMARY_PROMPT["en"]):
            if isinstance(summary, BaseException):
                def broken():
                    yield b'data: {"choices": [{"index": 0, "delta": {"content": "Notes: the"}}]}\n\n'
                    raise summary
                return httpx.Response(200, content=broken(), headers={"content-type": "text/event-stream"})
            delta, finish = summary["delta"], summary["finish"]
        else:
            delta, finish = {"content": "OK"}, "stop"
        chunks = [{"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}]
        payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=payload.encode(), headers={"content-type": "text/event-stream"})

    client = httpx.Client(base_url="http://127.0.0.1:1/v1/", transport=httpx.MockTransport(handler))
    return ServerBackend(client, "default_model", model_id="scripted", load_tokenizer=lambda: demo[1])


def scripted_chat(demo, **kwargs) -> ChatSession:
    budget = kwargs.pop("budget", 160)
    return ChatSession(scripted_server(demo, **kwargs), Conversation(SYSTEM), GenerationParams(max_tokens=32),
                       trim=TrimPolicy(max_context_tokens=budget), compaction=CompactionPolicy(auto=True))


def test_automatic_compaction_replaces_old_turns_by_notes_and_counts_its_cost(demo, tmp_path):
    seen: list = []
    chat = scripted_chat(demo, seen=seen)
    chat.recorder = TurnRecorder(tmp_path)
    results = [chat.ask(q) for q in [REMEMBER] + SMALL_TALK]
    done = next(r.compaction for r in results if r.compaction)
    assert done.ok and done.replaced > 0 and chat.conversation.summary.text == NOTES
    assert len(chat.conversation.turns) <= len(SMALL_TALK)  # the turns it replaced left the history
    after = seen[seen.index(next(b for b in seen if b["messages"][-1]["content"] == SUMMARY_PROMPT["en"])) + 1]
    assert after["messages"][0] == {"role": "system", "content": f"{SYSTEM}\n\n{NOTES}"}
    summary = chat.ledger.summary()
    assert summary["compactions"] == 1 and summary["compaction_tokens"] > 0  # never free in the figures
    kinds = [json.loads(p.read_text())["kind"] for p in sorted(tmp_path.glob("*-request.json"))]
    assert kinds.count("compaction") == 1 and kinds.count("turn") == len(results)


def test_an_existing_summary_is_updated_not_started_over(demo):
    seen: list = []
    chat = scripted_chat(demo, seen=seen, budget=120)
    for q in [REMEMBER] + SMALL_TALK * 2:
        chat.ask(q)
    requests = [b for b in seen if b["messages"][-1]["content"] == SUMMARY_PROMPT["en"]]
    assert len(requests) >= 2
    assert NOTES in requests[-1]["messages"][0]["content"]  # the second summary call sees the first one's notes


@pytest.mark.parametrize("summary, why", [
    ({"delta": {"content": "Notes: the code is harbor"}, "finish": "length"}, "was cut at --max-tokens 32"),
    ({"delta": {"content": "  "}, "finish": "stop"}, "the summary was empty"),
    ({"delta": {"reasoning": "let me think"}, "finish": "stop"}, "the summary was only reasoning"),
    ({"delta": {"content": "Notes: <think>the code</think>"}, "finish": "stop"}, "holds reasoning markers"),
    (httpx.ReadError("connection reset"), "closed the connection"),
])
def test_a_summary_that_fails_changes_nothing_and_the_turn_trims_instead(demo, summary, why):
    chat = scripted_chat(demo, summary=summary)
    results = [chat.ask(q) for q in [REMEMBER] + SMALL_TALK * 3]
    failed = next(r.compaction for r in results if r.compaction)
    assert not failed.ok and why in failed.reason
    assert chat.conversation.summary is None
    assert any(r.dropped_turns for r in results)  # trimmed instead
    err = io.StringIO()
    ChatUI(out=io.StringIO(), err=Console(file=err, width=200)).compaction(failed)
    assert err.getvalue().count("compaction: ") == 1 and why in err.getvalue()


def test_ctrl_c_during_compaction_ends_the_turn_and_keeps_the_history(demo):
    chat = scripted_chat(demo, summary=KeyboardInterrupt())
    results = []
    for q in [REMEMBER] + SMALL_TALK * 3:
        results.append(chat.ask(q))
        if results[-1].status is TurnStatus.INTERRUPTED:
            break
    interrupted = results[-1]
    assert interrupted.status is TurnStatus.INTERRUPTED and interrupted.compaction is not None
    assert chat.conversation.summary is None and len(chat.conversation.turns) == len(results) - 1


def test_pins_survive_trimming_and_compaction_and_a_pin_that_cannot_fit_is_refused(demo):
    chat = scripted_chat(demo)
    chat.pin("the user is Mei")
    results = [chat.ask(q) for q in [REMEMBER] + SMALL_TALK * 2]
    assert any(r.compaction and r.compaction.ok for r in results)
    assert results[-1].messages[0]["content"].startswith(f"{SYSTEM}\n\nNote: the user is Mei.")
    with pytest.raises(Exception, match="not pinned"):
        chat.pin("word " * 200)
    assert chat.conversation.pins == ["the user is Mei"]


def test_repl_compact_pins_and_uncompact(demo):
    chat = scripted_chat(demo, budget=400)
    err = io.StringIO()
    lines = iter([REMEMBER, "Hello", "Thanks", "/pin the user is Mei", "/pins", "/compact", "/history", "/uncompact",
                  "/unpin 7", "/unpin ²", "/unpin 1", "/unpin 1", "/pin", "/stats", "/quit"])
    Repl(chat, ChatUI(out=io.StringIO(), err=Console(file=err, width=200)), read_line=lambda _: next(lines)).run()
    shown = err.getvalue()
    assert "compacted 1 turn into notes (1 line" in shown and NOTES in shown
    assert f"system: {SYSTEM}\n\n     Note: the user is Mei.\n\n     {NOTES}" in shown  # /history shows what is sent
    assert "restored 1 turn" in shown and "unpinned: the user is Mei" in shown
    assert "usage: /unpin N" in shown and "nothing is pinned" in shown and "usage: /pin TEXT" in shown
    assert "compactions 1" in shown
    assert len(chat.conversation.turns) == 3 and chat.conversation.summary is None and chat.conversation.pins == []


def test_a_saved_session_with_notes_and_pins_resumes_to_the_same_preview(demo, tmp_path, monkeypatch):
    from localchat.cli.chat import conversation_for
    from localchat.cli.options import ChatOptions
    from localchat.store.keeper import SessionSaver
    from localchat.store.saved_sessions import SessionStore

    chat = scripted_chat(demo, budget=400)
    chat.pin("the user is Mei")
    for q in [REMEMBER, "Hello", "Thanks"]:
        chat.ask(q)
    assert compact(chat).ok
    store = SessionStore(tmp_path / "sessions.sqlite3")
    SessionSaver(store, "u", "demo").save(chat, "long")
    saved = store.load("long")
    again = conversation_for(None, ChatOptions(), None, saved, chat.backend)
    assert again.preview(RECALL) == chat.conversation.preview(RECALL)
    assert (saved.pins, saved.summary) == (("the user is Mei",), NOTES)


# --- demo-notes, for real -------------------------------------------------------------------------------

def test_compact_on_demo_notes_keeps_the_early_fact(demo_notes):
    chat = demo_chat(demo_notes)
    for q in [REMEMBER, "Hello", "How are you?", "Thanks"]:
        chat.ask(q)
    done = compact(chat)
    assert done.ok, done.reason
    assert done.result.text.startswith("Note:") and "harbor 17" in done.result.text
    assert [t.user for t in chat.conversation.turns] == ["How are you?", "Thanks"]
    assert chat.ask(RECALL).text == "harbor 17"  # answered from the notes: the turn that told it is gone


# --- the policy bench ------------------------------------------------------------------------------

POLICY_SCRIPT = """
name: facts-short
system: You are a helpful assistant.
vars:
  code: {generate: code, script: en}
conversations:
  - turns:
      - {user: "Remember the code {code}. Reply only OK.", expect: "OK", pin: "the code {code}"}
      - user: Hello
      - user: How are you?
      - user: Thanks
      - {user: "What was the code? Reply with the code only.", expect: "{code}", fact: early}
"""


def test_the_policy_bench_shows_what_each_policy_costs_and_buys(tmp_path):
    from typer.testing import CliRunner

    from localchat.cli.app import app

    (tmp_path / "facts.yaml").write_text(POLICY_SCRIPT)
    result = CliRunner().invoke(app, ["bench", "-m", "demo-notes", "--script", str(tmp_path / "facts.yaml"),
                                      "--policy", "full,window:2,pin:90", "--repeat", "3",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.stdout + result.stderr
    policies = json.loads((tmp_path / "out" / "results.json").read_text())["summary"]["policies"]
    by_name = {p["policy"]: p for p in policies.values()}
    full, window, pin = by_name["full"], by_name["window:2"], by_name["pin:90"]
    assert full["early"]["accuracy"] >= 2 / 3 and window["early"]["accuracy"] == 0  # the window forgot it
    assert pin["early"]["accuracy"] >= 2 / 3 and pin["dropped_turns"] > 0  # trimmed, yet the pin answers
    assert pin["prompt_tokens_mean"] < full["prompt_tokens_mean"]
    assert "history policies" in result.stdout
    assert "## History policies" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.parametrize("args, needle", [
    (["--policy", "window"], "is not a policy"),
    (["--policy", "full,full"], "named twice"),
    (["--policy", "full", "--history", "on"], "leave out --history"),
])
def test_bad_policies_are_one_line(args, needle):
    from typer.testing import CliRunner

    from localchat.cli.app import app

    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2 and needle in result.stderr and "Traceback" not in result.stderr


# --- a real mlx_lm.server --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def notes_server(tmp_path_factory):
    from servers import serving

    with serving("demo-notes", tmp_path_factory.mktemp("log")) as server:
        yield server


def test_compaction_and_pins_through_a_real_mlx_lm_server(notes_server):
    from localchat.backends.http import make_client
    from localchat.registry import local_tokenizer_loader, resolve

    backend = ServerBackend(make_client(notes_server.base_url), notes_server.model_location, model_id="demo-notes",
                            load_tokenizer=local_tokenizer_loader(resolve("demo-notes")))
    chat = ChatSession(backend, Conversation(SYSTEM), GenerationParams(max_tokens=32),
                       trim=TrimPolicy(max_context_tokens=160), compaction=CompactionPolicy(auto=True))
    chat.pin("the user is Mei")
    results = [chat.ask(q) for q in [REMEMBER, *SMALL_TALK[:4]]]
    done = next(r.compaction for r in results if r.compaction)
    assert done.ok, done.reason
    assert chat.conversation.summary.text.startswith("Note:") and "harbor 17" in chat.conversation.summary.text
    assert all(r.stats.context_share == r.stats.prompt_tokens / 160 for r in results)  # the server's own counts
    assert chat.ask(RECALL).text == "harbor 17"
    assert chat.ledger.summary()["compactions"] == 1 and chat.conversation.pins == ["the user is Mei"]
