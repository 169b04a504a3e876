"""`localchat load`: simulated users against a real mlx_lm.server (the demo model) and against
fakes that fail some requests, are slow, or die mid-run."""

import json
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from fakeserver import GOOD, FakeServer, Reply, delta, sse
from localchat.cli.app import app

runner = CliRunner()
SCRIPT = """
name: recall-3
system: You are a helpful assistant.
vars:
  code: {generate: code, script: en}
conversations:
  - turns:
      - user: "Remember the code {code}. Reply only OK."
      - user: How are you?
      - {user: "What was the code? Reply with the code only.", expect: "{code}"}
"""


def load(*args):
    return runner.invoke(app, ["load", *args])


@pytest.fixture(scope="module")
def demo_load(tmp_path_factory):
    """4 users × 3 turns against a launched mlx_lm.server, history on and off."""
    tmp = tmp_path_factory.mktemp("load")
    (tmp / "recall-3.yaml").write_text(SCRIPT)
    result = load("--launch", "-m", "demo", "--users", "4", "--conversations", "1", "--script",
                  str(tmp / "recall-3.yaml"), "--out", str(tmp / "out"))
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads((tmp / "out" / "results.json").read_text())
    rows = (tmp / "out" / "requests.csv").read_text().splitlines()
    return data, rows, result


def run_of(data, history):
    return next(r for r in data["runs"] if r["history"] == history)


def test_every_request_succeeds_and_history_buys_the_recall(demo_load):
    data, rows, _ = demo_load
    on, off = run_of(data, "on"), run_of(data, "off")
    for run in (on, off):
        assert (run["requests"], run["ok"], run["errors"]) == (12, 12, {})
    # ~1.0: the demo model misses words with repeated letters (its card), and user 3 draws "wnweok 18"
    assert on["accuracy"]["scored"] == 4 and on["accuracy"]["correct"] >= 3
    assert off["accuracy"] == {"correct": 0, "scored": 4, "rate": 0.0}
    assert len(rows) == 1 + 24
    assert data["schema"] == "localchat.load/2" and not data["partial"]
    assert data["environment"]["seed_sent"] is False and "may batch" in data["environment"]["batching"]


def test_cached_tokens_grow_with_the_turn_index_when_history_is_on(demo_load):
    data, _, _ = demo_load
    by_turn = run_of(data, "on")["by_turn"]
    cached = [by_turn[n]["cached_tokens_mean"] for n in ("1", "2", "3")]
    prompt = [by_turn[n]["prompt_tokens_mean"] for n in ("1", "2", "3")]
    assert cached[0] < cached[1] < cached[2] and prompt[0] < prompt[1] < prompt[2]
    flat = run_of(data, "off")["by_turn"]
    assert max(t["prompt_tokens_mean"] for t in flat.values()) < prompt[2]


def test_per_user_figures_add_up_to_the_totals(demo_load):
    data, rows, _ = demo_load
    for run in data["runs"]:
        per_user = run["output_tps_per_user"]
        assert len(per_user) == 4
        assert sum(per_user.values()) * run["wall_s"] == pytest.approx(run["output_tokens"])
    header = rows[0].split(",")
    users = [row.split(",")[header.index("user")] for row in rows[1:]]
    assert sorted(set(users)) == ["0", "1", "2", "3"] and all(users.count(u) == 6 for u in set(users))


def test_the_table_shows_both_settings_and_the_environment(demo_load):
    _, _, result = demo_load
    assert "localchat load" in result.stdout and "(launched here)" in result.stdout
    assert "cached/prompt tokens by turn" in result.stdout


def test_the_launched_server_is_stopped_no_orphan(demo_load):
    import httpx

    from localchat.server.launch import port_is_free

    data, _, _ = demo_load
    url = httpx.URL(data["environment"]["server"])
    assert data["environment"]["launched"] and port_is_free(url.host, url.port)


# --- fakes ---------------------------------------------------------------------------------------

@pytest.fixture
def server():
    fake = FakeServer()
    yield fake
    fake.close()


def test_a_server_that_errors_some_requests_is_counted_by_kind(server, tmp_path):
    server.chat([Reply(chunks=GOOD), Reply(503, [b'{"error": "busy"}'], {"Content-Type": "application/json"})])
    result = load("--base-url", server.base_url, "--users", "2", "--history", "on", "--out", str(tmp_path))
    assert result.exit_code == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "http-5xx" in errors[0] and "Traceback" not in result.stderr
    run = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    assert run["errors"]["http-5xx"] == run["requests"] - run["ok"] > 0 and run["ok"] > 0


def test_a_slow_server_is_bounded_by_the_duration(server):
    slow = sse(delta("Hi"), delta(" there", "stop"))
    server.chat(Reply(chunks=slow, pause_s=0.2))
    started = time.perf_counter()
    result = load("--base-url", server.base_url, "--users", "3", "--conversations", "50", "--duration", "1",
                  "--history", "on", "--warmup", "0")
    assert result.exit_code == 0, result.stderr
    assert time.perf_counter() - started < 5
    row = next(line for line in result.stdout.split("\n") if " on " in line).split()
    requests = int(row[row.index("on") + 1])  # the row of "1 user", history "on": its requests
    assert 3 <= requests <= 3 * 2  # each user starts at most two requests of ~0.6 s in 1 s
    assert "no batching gain (it needs a 1-user run: --sweep 1,…)" in " ".join(result.stdout.split())
    assert "×–" not in result.stdout


def test_a_server_that_dies_mid_run_is_error_counts_and_one_line(tmp_path):
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(delta("Hi"), delta(" there", "stop")), pause_s=0.1))
    def kill_once_serving():  # (a timer from the start could fire before a loaded machine's run began)
        deadline = time.monotonic() + 60
        def chatting():
            return any(path.endswith("/chat/completions") for path, _, _ in fake.requests)

        while not chatting() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        fake.close()

    killer = __import__("threading").Thread(target=kill_once_serving, daemon=True)
    killer.start()
    result = load("--base-url", fake.base_url, "--users", "2", "--conversations", "20", "--history", "on",
                  "--warmup", "0", "--timeout", "2", "--out", str(tmp_path))
    killer.join()
    assert result.exit_code == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    run = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    assert run["ok"] > 0 and run["requests"] > run["ok"]


@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_every_user_and_writes_partial_results(server, tmp_path, stop, code):
    server.chat(Reply(chunks=sse(delta("Hi"), delta(" there", "stop")), pause_s=0.3))
    process = subprocess.Popen([sys.executable, "-m", "localchat", "load", "--base-url", server.base_url,
                                "--users", "3", "--conversations", "100", "--warmup", "0", "--out", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60  # the users are running: a first round answered, the next asked
    while sum(path.endswith("/chat/completions") for path, _, _ in server.requests) < 6:
        assert time.monotonic() < deadline and process.poll() is None, "the load never started"
        time.sleep(0.05)
    process.send_signal(stop)
    stdout, stderr = process.communicate(timeout=20)
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr and "partial" in stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["partial"] and data["runs"][0]["requests"] > 0
    assert "localchat load" in stdout


def test_compaction_under_load_is_counted_as_the_requests_it_costs(server, tmp_path):
    server.chat(Reply(chunks=GOOD))
    result = load("--base-url", server.base_url, "-m", "demo", "--users", "1", "--conversations", "1",
                  "--turns", "8", "--history", "on", "--warmup", "0", "--max-context-tokens", "90",
                  "--compact", "auto", "--out", str(tmp_path))
    assert result.exit_code == 0, result.stdout + result.stderr
    run = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    bodies = [json.loads(body) for path, _, body in server.requests if path.endswith("/chat/completions")]
    summaries = [b for b in bodies if "Summarize the conversation" in b["messages"][-1]["content"]]
    assert run["compactions"]["calls"] == len(summaries) >= 1 and run["compactions"]["tokens"] > 0
    assert run["requests"] == 8  # the summary calls are not requests of the users


@pytest.mark.parametrize("args, needle", [
    (["--sweep", "1,x"], "--sweep takes whole numbers"),
    (["--sweep", "0,2"], "from 1 to 256"),
    (["--sweep", "2,2"], "once"),
    (["--duration", "0"], "--duration"),
    (["--slo-ttft", "-1"], "--slo-ttft"),
    (["--launch", "--base-url", "http://127.0.0.1:9/v1"], "leave out --base-url"),
    (["--", "--decode-concurrency", "4"], "need --launch"),
    (["--base-url", "http://127.0.0.1:9/v1"], "nothing is listening"),
    (["--script", "/nonexistent.yaml"], "/nonexistent.yaml"),
    (["--compact", "auto"], "needs a budget"),
    (["--max-context-tokens", "100", "--trim-to", "1.5"], "--trim-to"),
    (["--compact", "always"], "--compact"),
])
def test_bad_input_is_one_line(args, needle):
    result = load(*args)
    assert result.exit_code in (1, 2), result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], result.stderr


def test_repeated_passes_give_each_run_an_interval(tmp_path):
    (tmp_path / "recall-3.yaml").write_text(SCRIPT)
    fake = FakeServer()
    fake.chat(Reply(chunks=GOOD, pause_s=0.01))
    try:
        result = load("--base-url", fake.base_url, "--users", "2", "--conversations", "1", "--repeat", "3",
                      "--history", "on", "--warmup", "0", "--script", str(tmp_path / "recall-3.yaml"),
                      "--out", str(tmp_path / "out"))
    finally:
        fake.close()
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["repeat"] for r in data["runs"]] == [0, 1, 2]
    (repeated,) = data["repeated"]
    assert repeated["passes"] == 3 and repeated["users"] == 2
    assert repeated["output_tps"]["low"] <= repeated["output_tps"]["value"] <= repeated["output_tps"]["high"]
    assert "2 users, history on, 3 passes (median [the 3 passes' range]; --repeat 5 or more gives a 95 % " \
           "interval): out tok/s" in " ".join(result.stdout.split())  # three values are not a 95 % interval
    assert "2 users (pass 3)" in result.stdout
    assert "2 users (pass 3), history on: cached/prompt tokens by turn" in " ".join(result.stdout.split())
