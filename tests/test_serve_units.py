"""serve's pure logic as units, in milliseconds (no engine, no port): admission's plans, keep-alive
values, routing by name in the pool (and a pool of one remote entry), what a request asks to be
enforced, and the disk tier's key. The end-to-end tests (test_router, test_serve_hostile,
test_prompt_cache) keep showing the same behaviour through real engines."""

from __future__ import annotations

import math

import pytest

from localchat.errors import UsageError
from localchat.serve.engine.requested import RequestRefused, enforcement_of
from localchat.serve.pool.admission import Resident, admit
from localchat.serve.pool.entries import upstream_pool
from localchat.serve.pool.keep_alive import parse_keep_alive, shown
from localchat.serve.pool.pool import ModelPool, NotServed
from localchat.serve.pool.served import LOADED, ServedModel
from localchat.serve.pool.upstream import Upstream
from localchat.store.prompt_files import identity

GB = 10**9


def resident(key: str, size: int, *, busy: bool = False, used: float = 0.0, pinned: bool = False) -> Resident:
    return Resident(key=key, bytes=size * GB, busy=busy, last_used=used, pinned=pinned)


def test_admission_loads_what_fits_and_unloads_the_least_recently_used_idle_first():
    assert admit(2 * GB, [resident("a", 3)], 10 * GB) == admit(0, [], None)  # fits: nothing to do
    plan = admit(6 * GB, [resident("old", 3, used=1), resident("new", 3, used=5)], 10 * GB)
    assert plan.unload == ("old",) and plan.refused is None


def test_admission_waits_for_busy_models_and_never_moves_pinned_ones():
    assert admit(6 * GB, [resident("busy", 6, busy=True)], 10 * GB).wait_for == ("busy",)
    assert admit(6 * GB, [resident("pinned", 6, pinned=True)], 10 * GB).refused == "pinned"
    assert admit(11 * GB, [], 10 * GB).refused == "alone"
    assert admit(11 * GB, [resident("a", 2)], 10 * GB, force=True).unload == ("a",)


@pytest.mark.parametrize("value, seconds", [("5m", 300.0), ("30s", 30.0), ("1h30m", 5400.0), (0, 0.0), ("0", 0.0),
                                            ("never", None), (-1, None), ("250ms", 0.25), (1e12, None)])
def test_keep_alive_values_are_read_as_ollama_reads_them(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "", True, [5], math.nan, "1e400x", "m5"])
def test_keep_alive_nonsense_is_one_usage_line(value):
    with pytest.raises(UsageError, match="keep-alive"):
        parse_keep_alive(value)


def test_keep_alive_is_written_back_as_it_is_read():
    assert [shown(s) for s in (None, 0.0, 30.0, 300.0, 5400.0, 3600.0)] == ["never", "0s", "30s", "5m", "1h30m", "1h"]


def served(key: str, *names: str) -> ServedModel:
    return ServedModel(key=key, names=frozenset({key, *names}), state=LOADED)


def pool_of(*models: ServedModel) -> ModelPool:
    return ModelPool(list(models), launcher=lambda model: (_ for _ in ()).throw(AssertionError("no load here")))


def test_the_pool_routes_by_id_alias_and_path_and_one_model_takes_any_name():
    two = pool_of(served("demo", "/models/demo", "toy"), served("smollm2", "HuggingFaceTB/SmolLM2"))
    assert two.find("toy").key == "demo" and two.find("HuggingFaceTB/SmolLM2").key == "smollm2"
    assert two.find("") is two.models[0] and two.find("default_model") is two.models[0]
    assert two.find("claude-sonnet-4-5") is None
    with pytest.raises(NotServed) as refused:
        two.lease("gpt-5")
    assert refused.value.status == 404 and "demo, smollm2" in refused.value.message
    assert pool_of(served("demo")).find("claude-sonnet-4-5").key == "demo"


def test_a_pool_of_one_remote_entry_stands_for_gateway_upstream():
    named = Upstream(base_url="http://127.0.0.1:9/v1", model_field="/models/demo", model_id="demo",
                     served=frozenset({"/models/demo"}))
    pool = upstream_pool(named)
    assert pool.model_ids() == ["demo"] and pool.health_upstream() is named and pool.loaded("anything")
    lease = pool.lease("claude-sonnet-4-5")
    assert lease.upstream is named and pool.models[0].in_flight == 1
    lease.release()
    lease.release()  # (once, whatever happens)
    assert pool.models[0].in_flight == 0
    unnamed = Upstream(base_url="http://127.0.0.1:9/v1", model_field="default_model", model_id="the server's model",
                       served=frozenset({"/a/path", "org/b", "a"}), named=False)
    assert upstream_pool(unnamed).model_ids() == ["a", "org/b"]  # what it lists, never a path


def test_what_a_request_asks_to_be_enforced_is_read_before_anything_is_generated():
    assert enforcement_of({"messages": []}) is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    asked = enforcement_of({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    assert asked is not None and asked.schema == schema and asked.kind == "json_schema"
    with pytest.raises(RequestRefused) as refused:
        enforcement_of({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
                        "stop": ["x"]})
    assert refused.value.param == "stop"


def test_the_disk_tiers_key_changes_with_the_model_and_every_kv_setting():
    base = identity("weights", {"kv_bits": None, "kv_group_size": 64, "quantized_kv_start": 0})
    assert base == identity("weights", {"kv_group_size": 64, "kv_bits": None, "quantized_kv_start": 0})
    assert len({base, identity("other", {"kv_bits": None, "kv_group_size": 64, "quantized_kv_start": 0}),
                identity("weights", {"kv_bits": 8, "kv_group_size": 64, "quantized_kv_start": 0}),
                identity("weights", {"kv_bits": None, "kv_group_size": 32, "quantized_kv_start": 0})}) == 4


def test_upstream_names_are_each_served_once_and_urls_parsed_before_anything_is_reached():
    from fakeserver import FakeServer, Reply
    from localchat.fit.check import FitSettings
    from localchat.serve.pool.entries import served_models

    server = FakeServer()
    server.replies["/v1/models"] = Reply(chunks=[b'{"data": [{"id": "m"}]}'],
                                         headers={"Content-Type": "application/json"})
    try:
        assert [m.key for m in served_models([], [], [f"big={server.base_url}"], FitSettings())] == ["big"]
        with pytest.raises(UsageError, match="already served"):
            served_models([], [], [f"big={server.base_url}", f"big={server.base_url}"], FitSettings())
    finally:
        server.close()
    for bad in ("big=http://[::1/v1", "big=http://host:99999/v1", "big", "=http://x/v1", "big=ftp://x"):
        with pytest.raises(UsageError, match="--upstream"):
            served_models([], [], [bad], FitSettings())


def test_only_regular_pictures_inside_the_results_directory_are_listed_or_served(tmp_path):
    from localchat.serve.page.api import _plot_file

    results, outside = tmp_path / "res", tmp_path / "secret.png"
    results.mkdir()
    outside.write_bytes(b"\x89PNG")
    (results / "bench.png").write_bytes(b"\x89PNG")
    (results / "linked.png").symlink_to(outside)
    (results / "dir.png").mkdir()
    assert _plot_file(results, "bench.png") == results / "bench.png"
    for name in ("linked.png", "dir.png", "x" * 300 + ".png", "../secret.png", "a\x00.png", "bench.txt", ".png"):
        assert _plot_file(results, name) is None, name


def test_a_lease_says_how_long_it_waited_for_room_and_for_its_load_and_nothing_when_it_did_not():
    import threading
    import time
    from types import SimpleNamespace

    from localchat.fit.budget import MemoryBudget

    def launcher(model: ServedModel):
        time.sleep(0.15)  # the engine loading
        server = SimpleNamespace(process=SimpleNamespace(pid=0, poll=lambda: None), stop=lambda: None)
        return server, Upstream(base_url="http://127.0.0.1:9/v1", model_field=model.key, model_id=model.key)

    busy = ServedModel(key="a", names=frozenset({"a"}), state=LOADED, estimate=60, in_flight=1)
    busy.server = SimpleNamespace(process=SimpleNamespace(pid=0, poll=lambda: None), stop=lambda: None)
    busy.upstream = Upstream(base_url="http://127.0.0.1:9/v1", model_field="a", model_id="a")
    other = ServedModel(key="b", names=frozenset({"b"}), estimate=60)
    pool = ModelPool([busy, other], launcher=launcher, budget=MemoryBudget(bytes=100, source="a test"))
    threading.Timer(0.3, pool._release, (busy, None)).start()  # ``a`` finishes its request after 0.3 s
    lease = pool.lease("b")
    assert lease.room_s is not None and lease.room_s >= 0.25  # waited for ``a`` to finish and unload
    assert lease.loaded_s is not None and lease.loaded_s >= 0.1
    again = pool.lease("b")
    assert again.room_s is None and again.loaded_s is None  # loaded already: it waited for nothing


def test_the_gateway_keeps_reasoning_of_the_current_turn_only_and_tools_in_one_order():
    from types import SimpleNamespace

    from localchat.backends import GenerationParams
    from localchat.serve.pool.upstream import REASONING_KEY, in_stable_order
    from localchat.serve.request import GatewayRequest

    upstream = Upstream(base_url="http://127.0.0.1:9/v1", model_field="m", model_id="m")
    upstream.template = SimpleNamespace(traits=SimpleNamespace(reasoning_field="reasoning_content",
                                                               fold_system=False))
    call = {"role": "assistant", "content": "", REASONING_KEY: "now",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]}
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", REASONING_KEY: "before"},
                {"role": "user", "content": "c"}, call, {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    request = GatewayRequest(model="m", system="s", messages=messages, params=GenerationParams(), stream=False)
    shaped = upstream.shaped(request)
    assert [m.get("reasoning_content") for m in shaped] == [None, None, None, None, "now", None]
    dropped = [{k: v for k, v in m.items() if k != REASONING_KEY} if i == 1 else m for i, m in enumerate(messages)]
    assert upstream.shaped(GatewayRequest(model="m", system="s", messages=dropped, params=GenerationParams(),
                                          stream=False)) == shaped  # sent back or dropped: one prompt
    tools = [{"type": "function", "function": {"name": name}} for name in ("Read", "Bash", "Edit")]
    assert [t["function"]["name"] for t in in_stable_order(tools)] == ["Bash", "Edit", "Read"]
    assert in_stable_order(tools[::-1]) == in_stable_order(tools)


@pytest.mark.parametrize("body, param", [
    ({"think_budget": -1}, "think_budget"), ({"think_budget": 4.0}, "think_budget"),
    ({"think_budget": 2, "think_budget_message": "\x07"}, "think_budget_message"),
    ({"reasoning_effort": "enormous"}, "reasoning_effort"),
])
def test_a_requests_budget_is_refused_naming_its_field(body, param):
    from localchat.serve.engine.requested import think_budget_of

    with pytest.raises(RequestRefused) as refused:
        think_budget_of(body, None)
    assert refused.value.param == param and "\n" not in str(refused.value)


def test_a_requests_own_budget_wins_over_serves_and_an_effort_is_one():
    from localchat.grammar.think_budget import ThinkBudget
    from localchat.serve.engine.requested import think_budget_of

    default = ThinkBudget(tokens=64)
    assert think_budget_of({}, default) == default and think_budget_of({"think_budget": "none"}, default) is None
    assert think_budget_of({"think_budget": 8, "think_budget_message": "Answer."}, default) == ThinkBudget(8, "Answer.")
    assert think_budget_of({"reasoning_effort": "minimal"}, default) == ThinkBudget(0)
    assert think_budget_of({"reasoning_effort": "high"}, default) is None  # the model's own length


class HeldTransport:
    """What ``UpstreamReply`` asks of the engine's socket: reading paused and resumed."""

    def __init__(self):
        self.reading, self.written = True, b""

    def write(self, data: bytes) -> None:
        self.written += data

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        pass


def test_the_relay_reads_the_engines_head_then_pieces_and_stops_reading_for_a_slow_client():
    import asyncio

    from localchat.serve.apis.chat_completions.byte_relay import HELD_BYTES, UpstreamReply

    async def relayed() -> None:
        reply, socket = UpstreamReply(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n"), HeldTransport()
        reply.connection_made(socket)  # type: ignore[arg-type]
        assert socket.written.startswith(b"POST ")
        reply.data_received(b"HTTP/1.0 200 OK\r\nX-Localchat-Prefix-Cache: cached=3\r\nContent-Type: text/event-")
        reply.data_received(b"stream\r\n\r\ndata: {}\n\n")
        status, headers, first = await reply.head()
        assert (status, headers["content-type"], headers["x-localchat-prefix-cache"], first) == (
            200, "text/event-stream", "cached=3", b"data: {}\n\n")
        for _ in range(3):
            reply.data_received(b"x" * (HELD_BYTES // 2))  # a client that reads none of it
        assert not socket.reading
        assert len(await reply.received()) == 3 * (HELD_BYTES // 2) and socket.reading
        waiting = asyncio.ensure_future(reply.received())
        await asyncio.sleep(0)
        reply.eof_received()
        assert await waiting == b"" and await reply.received() == b""  # the engine ended its reply

    asyncio.run(relayed())


def test_an_engine_that_ends_before_its_headers_is_a_clear_error():
    import asyncio

    from localchat.serve.apis.chat_completions.byte_relay import UpstreamReply

    async def cut() -> None:
        reply = UpstreamReply(b"")
        reply.connection_made(HeldTransport())  # type: ignore[arg-type]
        reply.data_received(b"HTTP/1.0 200 OK\r\nContent-Ty")
        reply.connection_lost(None)
        with pytest.raises(ValueError, match="closed the connection before its answer"):
            await reply.head()

    asyncio.run(cut())


def test_the_front_writes_a_relayed_body_below_uvicorns_messages_and_the_client_reads_it_whole():
    """The installed uvicorn still has what ``front.direct_body`` takes of it (else relayed bodies
    would go back to a message a piece without a word): a body written to the client's socket,
    between the ASGI head and end, arrives whole and in order, framed as uvicorn framed the response."""
    import threading
    import time

    import httpx
    import uvicorn

    from localchat.serve.apis.chat_completions.byte_relay import DIRECT_BODY
    from localchat.serve.front.guards import header_deadline_protocol
    from localchat.server.launch import free_port

    seen: dict[str, bool] = {}

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        direct = scope["extensions"][DIRECT_BODY]
        seen["usable"] = direct.usable()
        if seen["usable"]:
            for piece in (b"data: one\n\n", b"", b"data: two\n\n"):
                direct.write(piece)
        await send({"type": "http.response.body", "body": b"data: three\n\n", "more_body": False})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="off",
                                           http=header_deadline_protocol(), loop="uvloop"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        with httpx.Client() as client:
            answers = [client.post(f"http://127.0.0.1:{port}/").text for _ in range(2)]  # (a kept-alive connection)
    finally:
        server.should_exit = True
        thread.join(30)
    assert seen["usable"] and answers == ["data: one\n\ndata: two\n\ndata: three\n\n"] * 2


def test_a_body_written_straight_to_a_slow_client_pauses_the_engine_until_the_client_takes_it():
    import asyncio

    from localchat.serve.apis.chat_completions.byte_relay import HELD_BYTES, UpstreamReply

    class SlowClient:
        def __init__(self):
            self.written, self.waiting = [], 0

        def usable(self) -> bool:
            return True

        def write(self, piece: bytes) -> None:
            self.written.append(piece)
            self.waiting += len(piece)

        def unsent(self) -> int:
            return self.waiting

    async def relayed() -> None:
        reply, engine, client = UpstreamReply(b""), HeldTransport(), SlowClient()
        reply.connection_made(engine)  # type: ignore[arg-type]
        reply.data_received(b"held before")  # (arrived before the head was sent on)
        reply.send_directly(client)
        reply.data_received(b"x" * (HELD_BYTES + 1))
        assert client.written[0] == b"held before" and not engine.reading
        await asyncio.sleep(0.12)
        assert not engine.reading  # the client has taken nothing yet
        client.waiting = 0
        await asyncio.sleep(0.12)
        assert engine.reading
        ending = asyncio.ensure_future(reply.finished())
        await asyncio.sleep(0)
        assert not ending.done()
        reply.connection_lost(None)
        await asyncio.wait_for(ending, 5)

    asyncio.run(relayed())
