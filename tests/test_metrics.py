"""``/metrics`` and where a prompt broke from its cache (``serve.front.metrics``,
``serve.engine.cache_breaks``, ``serve.engine.figures``): units on the pieces, then a real serve of
the demo scraped with prometheus_client's own parser, its header, ``ps`` and the client's figures line."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localchat.backends.openai_http import cache_break_of
from localchat.serve.engine.cache_breaks import Break, Outcome, located, parted
from localchat.serve.front.metrics import ServeMetrics
from routed import Serve

KEY = {"Authorization": "Bearer k-metrics"}


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def test_a_prompt_breaks_only_where_a_cached_sequence_goes_on_past_it():
    cached = list(range(100))
    assert parted(cached[:40] + [999] * 10, cached, 40).at == 40  # parted inside what is cached
    assert parted(cached + [5, 6], cached, 100) is None  # the next turn: past all that is cached
    assert parted([1, 2, 999], cached, 2) is None  # two tokens shared: another conversation
    assert parted(cached[:40], cached, 40) is None  # the prompt ends inside it: nothing new to part on


def test_the_break_is_located_in_its_message_and_said_in_one_header(demo):
    _, tokenizer = demo
    messages = [{"role": "system", "content": "The time is 10:42. " * 4},
                {"role": "user", "content": "What is the code?"}]
    system_only = len(tokenizer.apply_chat_template(messages[:1], tokenize=True))
    for at, message, role in ((5, 0, "system"), (system_only + 2, 1, "user")):
        found = located(Break(at=at, cached_after=(), new_after=(), before=()), tokenizer, messages, None)
        assert (found.message, found.role) == (message, role)
    outcome = Outcome(cached=5, tier="memory", broke=located(Break(5, (), (), ()), tokenizer, messages, None))
    header = outcome.header()
    assert header == "cached=5; tier=memory; broke-at=5; message=0; role=system"
    assert cache_break_of(header) == "message 0 (system)" and cache_break_of("cached=9; tier=disk") is None
    assert cache_break_of("broke-at=7") == "token 7" and cache_break_of("broke-at=x; message=0") is None


def test_serves_own_figures_follow_prometheus_conventions():
    metrics = ServeMetrics(lambda: {"models": [{"model": "m", "in_flight": 2, "memory_bytes": 10, "state": "loaded"}],
                                    "prompt_cache": {"bytes": 7, "files": 1}})
    metrics.request_ended("m", "messages", 200, 0.5, waits={"load": 3.0, "room": None})
    metrics.loaded("m")
    metrics.unloaded("m", "idle")
    metrics.refused("m")
    found = samples(metrics.text().decode())
    assert value(found, "localchat_requests_total", model="m", api="messages", status="200") == 1
    assert value(found, "localchat_wait_seconds_count", model="m", waited_for="load") == 1
    assert value(found, "localchat_model_unloads_total", model="m", reason="idle") == 1
    assert value(found, "localchat_admission_refusals_total", model="m") == 1
    assert value(found, "localchat_requests_in_flight", model="m") == 2
    assert value(found, "localchat_prompt_cache_disk_files") == 1
    units = ("_total", "_seconds", "_bytes", "_count", "_sum", "_bucket", "_created", "_files", "_in_flight",
             "_size")
    assert all(name.endswith(units) for name, _ in found), sorted({n for n, _ in found})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    serve = Serve(tmp_path_factory.mktemp("metrics") / "home", "-m", "demo", "--api-key", "k-metrics")
    yield serve
    serve.stop()


def ask(serve: Serve, system: str) -> httpx.Response:
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "Remember the code harbor 17. What is the code?"}]
    return httpx.post(serve.url + "/v1/chat/completions", headers=KEY, timeout=60,
                      json={"model": "demo", "messages": messages, "max_tokens": 8})


def test_a_clock_in_the_system_prompt_is_shown_where_it_broke_the_cache(served):
    first = ask(served, "You are helpful. The time is 10:41. " * 6)
    again = ask(served, "You are helpful. The time is 10:41. " * 6)
    moved = ask(served, "You are helpful. The time is 10:42. " * 6)
    assert "broke-at" not in first.headers["x-localchat-prefix-cache"]
    assert again.headers["x-localchat-prefix-cache"].startswith(f"cached={again.json()['usage']['prompt_tokens'] - 1}")
    header = moved.headers["x-localchat-prefix-cache"]
    assert "broke-at=" in header and "message=0; role=system" in header and "tier=memory" in header
    shown = subprocess.run([sys.executable, "-m", "localchat", "ps", "--port", str(served.port), "--api-key",
                            "k-metrics"], capture_output=True, text=True, timeout=60,
                           env=os.environ | {"COLUMNS": "200"})
    assert "the last prompt broke from its cache at token" in shown.stdout and "message 0 (system)" in shown.stdout


def test_metrics_are_behind_the_key_never_for_a_foreign_page_and_hold_the_engines_figures(served):
    ask(served, "A steady system prompt. " * 6)
    assert httpx.get(served.url + "/metrics", timeout=30).status_code == 401
    foreign = httpx.get(served.url + "/metrics", headers=KEY | {"Origin": "http://localhost:9999"}, timeout=30)
    assert foreign.status_code == 403
    scraped = httpx.get(served.url + "/metrics", headers=KEY, timeout=30)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    found = samples(scraped.text)
    assert value(found, "localchat_requests_total", model="demo", api="chat_completions", status="200") >= 1
    assert value(found, "localchat_prompt_tokens_total", model="demo") > 0
    assert value(found, "localchat_completion_tokens_total", model="demo") > 0
    ttfts = value(found, "localchat_engine_time_to_first_token_seconds_count", model="demo")
    assert ttfts >= 1 and value(found, "localchat_batch_queue_seconds_count", model="demo") == ttfts
    assert value(found, "localchat_batch_queue_seconds_sum", model="demo") <= value(
        found, "localchat_engine_time_to_first_token_seconds_sum", model="demo")  # the queue is part of the TTFT
    assert value(found, "localchat_kv_cache_bytes", model="demo") > 0
    assert value(found, "localchat_model_loads_total", model="demo") == 1
    assert value(found, "localchat_model_resident_bytes", model="demo") > 0


def test_the_figures_line_says_where_the_cache_broke(served, tmp_path):
    def chat(system: str) -> str:
        done = subprocess.run([sys.executable, "-m", "localchat", "chat", "--backend", "server", "--base-url",
                               served.url + "/v1", "--api-key", "k-metrics", "-m", "demo", "--system", system,
                               "What is the code?"], capture_output=True, text=True, timeout=120,
                              env=os.environ | {"LOCALCHAT_HOME": str(tmp_path), "COLUMNS": "200"})
        assert done.returncode == 0, done.stderr
        return done.stderr

    chat("The date is Monday, 7 December. " * 5)
    assert "cache broke at message 0 (system)" in chat("The date is Tuesday, 8 December. " * 5)


def test_load_shows_the_servers_side_beside_its_own(served, tmp_path):
    done = subprocess.run([sys.executable, "-m", "localchat", "load", "--base-url", served.url + "/v1", "--api-key",
                           "k-metrics", "-m", "demo", "--users", "2", "--conversations", "1", "--turns", "2"],
                          capture_output=True, text=True, timeout=300,
                          env=os.environ | {"LOCALCHAT_HOME": str(tmp_path), "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    side = next(line for line in done.stdout.splitlines() if line.startswith("server side (its /metrics)"))
    counted = int(side.split(": ", 1)[1].split()[0])
    assert counted >= 4, side  # 2 users × 2 turns (and load's own checks of the server), counted there
    assert "from memory" in side and "the largest batch so far" in done.stdout
    assert "ms on average in the batch queue" in done.stdout


def test_an_engine_without_the_front_is_counted_by_its_replies_and_its_waits_in_order():
    from localchat.load.server_side import Scrape, server_side_lines

    before = Scrape(values={("localchat_engine_time_to_first_token_seconds_count", ""): 2.0})
    after = Scrape(values={("localchat_engine_time_to_first_token_seconds_count", ""): 7.0,
                           ("localchat_prompt_tokens_total", ""): 100.0,
                           ("localchat_batch_queue_seconds_count", ""): 5.0,
                           ("localchat_batch_queue_seconds_sum", ""): 0.1})
    first, second = server_side_lines(before, after)
    assert "5 replies (an engine without serve's front)" in first
    assert second.index("for room") < second.index("for a load") < second.index("20 ms on average in the batch queue")


def test_an_excerpt_is_escaped_and_capped(demo):
    from localchat.serve.engine.cache_breaks import EXCERPT_CHARS, excerpt

    _, tokenizer = demo
    tokens = tuple(tokenizer.encode("\x1b]52;c;evil\x07 and \x00 nul " * 20))
    shown = excerpt(tokenizer, tokens)
    assert "\x1b" not in shown and "\x00" not in shown and "\x07" not in shown and len(shown) <= EXCERPT_CHARS
    assert "\\u001b" in excerpt(tokenizer, tokens[:8])


PROMETHEUS = "/usr/bin/prometheus"  # Debian's (``.ci/run`` installs it as it does Chromium)


class Prometheus:
    """A real Prometheus on a loopback port scraping ``target`` every second, in a process group of
    its own (stopped whole by the test that started it)."""

    def __init__(self, root, target: str, key: str):
        import signal
        import time

        from localchat.server.launch import free_port

        self.port = free_port()
        (root / "key").write_text(key)
        (root / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: serve\n    authorization: {{credentials_file: {root / 'key'}}}\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n")
        self.proc = subprocess.Popen([PROMETHEUS, f"--config.file={root / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={root / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.stop_signal = signal.SIGTERM
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise AssertionError("Prometheus did not become ready")

    def query(self, expression: str) -> float | None:
        answer = httpx.get(f"http://127.0.0.1:{self.port}/api/v1/query", params={"query": expression},
                           timeout=10).json()
        result = answer["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def settled(self, expression: str, wanted, seconds: float = 30) -> float | None:
        """The expression's value once ``wanted(value)`` holds (Prometheus scrapes every second)."""
        import time

        deadline, found = time.monotonic() + seconds, None
        while time.monotonic() < deadline:
            found = self.query(expression)
            if found is not None and wanted(found):
                return found
            time.sleep(0.5)
        return found

    def stop(self) -> None:
        import os as _os

        if self.proc.poll() is None:
            _os.killpg(self.proc.pid, self.stop_signal)
            self.proc.wait(30)


@pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason="Debian's prometheus is not installed (.ci/run installs it)")
def test_a_real_prometheus_scrapes_requests_cached_tokens_a_load_and_an_idle_unload(tmp_path):
    serve = Serve(tmp_path / "home", "-m", "demo", "-m", "demo-tools", "--api-key", "k-prom")
    prometheus = Prometheus(tmp_path, f"127.0.0.1:{serve.port}", "k-prom")
    try:
        counted = 'sum(localchat_requests_total{api="chat_completions"})'
        before = prometheus.settled(counted, lambda v: v >= 0) or 0.0
        cached_expression = 'sum(localchat_cached_prompt_tokens_total{model="demo"})'
        cached_before = prometheus.query(cached_expression) or 0.0  # (serve's readiness checks: before the run)
        cached = 0
        for model, keep in (("demo", None), ("demo", None), ("demo-tools", "1s")):
            body = {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Say OK. " * 20}]}
            answer = httpx.post(serve.url + "/v1/chat/completions", headers={"Authorization": "Bearer k-prom"},
                                json=body | ({"keep_alive": keep} if keep else {}), timeout=120).json()
            if model == "demo":  # (demo-tools is unloaded after 1s idle: its engine's series then go)
                cached += answer["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        assert prometheus.settled(counted, lambda v: v >= before + 3) == before + 3
        assert cached > 0
        assert prometheus.settled(cached_expression, lambda v: v >= cached_before + cached) == cached_before + cached
        assert prometheus.settled('localchat_model_loads_total{model="demo-tools"}', lambda v: v >= 1) == 1
        assert prometheus.settled('localchat_model_unloads_total{model="demo-tools",reason="idle"}',
                                  lambda v: v >= 1, seconds=60) == 1
    finally:
        prometheus.stop()
        serve.stop()


def test_a_reordered_tool_list_breaks_where_the_template_renders_the_tools(tmp_path):
    def tool(name: str) -> dict:
        return {"type": "function", "function": {"name": name, "description": f"the {name} tool",
                                                 "parameters": {"type": "object", "properties": {}}}}

    serve = Serve(tmp_path / "home", "-m", "demo-tools")
    try:
        def ask(tools: list[dict]) -> str:
            body = {"model": "demo-tools", "max_tokens": 4, "tools": tools,
                    "messages": [{"role": "system", "content": "You help. " * 5},
                                 {"role": "user", "content": "What is 2 plus 3?"}]}
            return httpx.post(serve.url + "/v1/chat/completions", json=body, timeout=60).headers[
                "x-localchat-prefix-cache"]

        ask([tool("add"), tool("multiply")])
        assert "broke-at" not in ask([tool("add"), tool("multiply")])  # unchanged: no break, its tier named
        assert "message=0; role=system" in ask([tool("multiply"), tool("add")])  # (this template: tools in system)
    finally:
        serve.stop()
