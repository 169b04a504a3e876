"""``serve`` on MLX's own distributed engine: ranks started by ``mlx.launch`` on loopback, checked
like one server (smoke, chat, parity token for token), every rank stopped on Ctrl+C, SIGTERM or a
rank's death, and bad input refused before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import owned
from localchat.cli.app import app
from localchat.server.distributed import failed_rank
from localchat.server.launch import free_port, server_env

runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def session_processes(sid: int) -> list[int]:
    """The live processes of a session that this test run started (a serve started with
    start_new_session, and its ranks: they carry the run's mark)."""
    return [p.pid for p in owned.owned() if p.session == sid]


def launcher_session(serve_pid: int) -> int:
    """The session of the ranks: ``serve`` starts mlx.launch in a session of its own."""
    return next(p.session for p in owned.owned() if p.parent == serve_pid)


def rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    rank = next((e for e in env if e.startswith(b"MLX_RANK=")), None)
    return int(rank.split(b"=")[1]) if rank else None


def serve(*args: str, home: Path) -> tuple[subprocess.Popen, int, list[str]]:
    """``localchat serve`` in its own session, once it says it is ready (its output so far)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "serve", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "LOCALCHAT_HOME": str(home), "TMPDIR": str(temporary(home))})
    lines: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl+C stops the server" in line:
            return proc, port, lines
    proc.kill()
    raise AssertionError("serve never became ready: " + "".join(lines))


def temporary(home: Path) -> Path:
    """The temporary directory a test's ``serve`` is given (``TMPDIR``): what is in it after it ends
    was left behind."""
    (home.parent / "tmp").mkdir(exist_ok=True)
    return home.parent / "tmp"


def gone(sid: int, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not session_processes(sid)


def test_two_ranks_of_the_demo_serve_chat_and_smoke_and_ctrl_c_leaves_nothing(home):
    proc, port, lines = serve("--ranks", "2", home=home)
    try:
        assert "2 ranks (ring)" in "".join(lines)
        sid = launcher_session(proc.pid)
        ranks = sorted(r for r in map(rank_of, session_processes(sid)) if r is not None)
        assert ranks == [0, 1]  # two mlx_lm.server processes, started by mlx.launch
        base = f"http://127.0.0.1:{port}/v1"
        named = httpx.post(base + "/chat/completions", timeout=60, json={
            "model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}).json()
        assert named["model"] == "demo"  # behind the front by its name; the ranks write the id themselves
        smoke = runner.invoke(app, ["smoke", "--base-url", base, "-m", "demo", "--json"])
        assert smoke.exit_code == 0, smoke.stdout
        checks = json.loads(smoke.stdout)["checks"]
        assert all(c["ok"] for c in checks)
        enforced = next(c for c in checks if c["name"].startswith("response_format"))
        assert enforced["detail"] == "valid JSON, enforced by the server"  # the mask works across ranks too
        chat = runner.invoke(app, ["chat", "--backend", "server", "--base-url", base, "-m", "demo"],
                             input="Remember the code harbor 17. Reply only OK.\nWhat was the code? Reply with the "
                                   "code only.\n")
        assert chat.exit_code == 0 and chat.stdout.count("harbor 17") == 1, chat.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
        left = session_processes(sid)  # the moment serve has returned: no rank may still be there
    assert proc.returncode == 0 and "server stopped (every rank)" in out
    assert left == [] and gone(proc.pid)
    assert list(temporary(home).iterdir()) == []  # (mlx.launch's ranks mktemp two files each)


def test_no_rank_outlives_a_serve_killed_with_sigkill(home):
    """Only the launcher has a parent-death signal; each local rank's guard sees serve go."""
    proc, _, _ = serve("--ranks", "2", home=home)
    sid = launcher_session(proc.pid)
    assert len([p for p in session_processes(sid) if rank_of(p) is not None]) == 2
    proc.kill()
    proc.wait()
    assert gone(sid, seconds=5), session_processes(sid)


@pytest.mark.parametrize("delay", [0.05, 0.4, 1.5])
def test_sigterm_in_the_first_moments_of_serve_is_one_line_143_and_leaves_nothing(home, delay):
    proc = subprocess.Popen([sys.executable, "-m", "localchat", "serve", "--ranks", "2", "--port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "LOCALCHAT_HOME": str(home)})
    try:
        owned.wait_until_localchat_runs(proc.pid)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # (a serve that ignored it: the test fails without leaving it serving)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143 and "terminated (SIGTERM)" in err and "Traceback" not in err, err
    assert gone(proc.pid, seconds=5)


def test_parity_of_two_ranks_with_one_process_is_token_for_token(home):
    result = runner.invoke(app, ["parity", "--ranks", "2", "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["ok"], result.stdout
    assert [t["inproc_text"] for t in report["turns"]] == [t["server_text"] for t in report["turns"]]


def test_smollm2_is_refused_at_two_ranks_and_its_heads_are_served_at_three(home, smollm2, tmp_path):
    refused = runner.invoke(app, ["serve", "-m", "smollm2", "--ranks", "2"])
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.exit_code == 2 and len(errors) == 1
    assert "9 attention heads (3 key/value heads): 2 ranks cannot share them evenly; use --ranks 3" in errors[0]
    assert "--pipeline, which splits layers instead, is not in mlx_lm" in errors[0]  # llama: heads only
    from demo.random_model import build_random_model

    # SmolLM2's heads (9, 3 of them key/value) in a two-layer toy: three ranks of SmolLM2 itself decode
    # at ~2 tokens a second on this 2-core CPU, a minute of the suite for what the heads alone decide
    toy = build_random_model(tmp_path / "nine-heads", hidden=72, layers=2, intermediate=144, heads=9, kv_heads=3)
    proc, port, _ = serve("-m", str(toy), "--ranks", "3", home=home)
    sid = launcher_session(proc.pid)
    try:
        chat = runner.invoke(app, ["chat", "--backend", "server", "--base-url", f"http://127.0.0.1:{port}/v1", "-m",
                                   str(toy), "--max-tokens", "8", "What is the capital of France?"])
        assert chat.exit_code == 0 and chat.stdout.strip(), chat.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0 and gone(proc.pid) and gone(sid)  # SIGTERM stops a server cleanly


def test_a_feed_forward_width_the_ranks_cannot_share_is_refused_before_anything_starts(home, tmp_path):
    """mlx_lm splits the feed-forward layers across the ranks as well as the heads: a width of 128
    at three ranks would start every rank and end in a traceback of each ("Cannot shard the output")."""
    from demo.random_model import build_random_model

    toy = build_random_model(tmp_path / "narrow", hidden=72, layers=2, intermediate=128, heads=9, kv_heads=3)
    refused = runner.invoke(app, ["serve", "-m", str(toy), "--ranks", "3"])
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.exit_code == 2 and len(errors) == 1, refused.stderr
    assert "9 attention heads (3 key/value heads) and a feed-forward width of 128: 3 ranks cannot share" in errors[0]
    assert "or --pipeline" in errors[0]  # (qwen2: mlx_lm splits its layers)


def test_a_rank_killed_mid_request_stops_every_rank_and_names_it(home):
    proc, port, _ = serve("--ranks", "2", home=home)
    sid = launcher_session(proc.pid)
    try:
        # rank 1 frozen first holds the request inside the server however short the demo's answer
        victim = next(pid for pid in session_processes(sid) if rank_of(pid) == 1)
        os.kill(victim, signal.SIGSTOP)
        client = subprocess.Popen([sys.executable, "-m", "localchat", "chat", "--backend", "server", "--base-url",
                                   f"http://127.0.0.1:{port}/v1", "--max-tokens", "3000", "--timeout", "20",
                                   "Tell me a long story."], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, "LOCALCHAT_HOME": str(home)})
        client_err = client.stderr.readline()  # "talking to …": the request follows at once
        time.sleep(1.5)
        os.kill(victim, signal.SIGKILL)
        client_err += client.communicate(timeout=60)[1]
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    errors = [line for line in client_err.splitlines() if line.startswith("error:")]
    assert client.returncode == 1 and len(errors) == 1 and "closed the connection" in errors[0], client_err
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, out
    assert errors[0].startswith("error: mlx_lm.server on 2 ranks ended: rank 1 was killed by SIGKILL; "), errors[0]
    assert "every rank has stopped" in errors[0] and "exit code 0" not in out and "Prompt processing" not in errors[0]
    assert "Traceback" not in out.split("the end of")[0] and gone(proc.pid) and gone(sid)
    assert list(temporary(home).iterdir()) == []  # a group that ended by itself leaves its files neither


@pytest.mark.parametrize("log, words", [
    ("\x1b[33m[WARN] Node with rank 1 exited with code -9 \x1b[0m\n", "rank 1 was killed by SIGKILL"),
    ("[WARN] Node with rank 0 exited with code 255 \n", "rank 0 exited with code 255 (ssh could not reach"),
    ("[WARN] Node with rank 2 was killed \n", "rank 2 was killed"),
    # another rank's line written into the middle of the launcher's (seen on CI): no signal 92026
    ("[WARN] Node with rank 1 exited with code -92026-12-04 15:00:41,464 - INFO - x\n \n", "rank 1 failed"),
])
def test_the_rank_that_failed_is_read_from_the_launchers_words(log, words):
    assert failed_rank(log).startswith(words) and failed_rank("2026-12-04 - INFO - Node with rank") is None


def test_a_distributed_server_is_started_buffered_so_the_launchers_lines_stay_whole(monkeypatch):
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    assert "PYTHONUNBUFFERED" not in server_env(distributed=True)
    assert server_env(distributed=False)["PYTHONUNBUFFERED"] == "1"
    assert server_env(distributed=True)["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("args, needle", [
    (["--ranks", "0"], "--ranks"), (["--ranks", "-1"], "--ranks"), (["--ranks", str(10**6)], "--ranks"),
    (["--ranks", "abc"], "--ranks"), (["--hostfile", "/nonexistent/hosts.json"], "no such file"),
    (["--hostfile", "{tmp}/bad.json"], "not JSON"), (["--hostfile", "{tmp}/empty.json"], "expected a list of hosts"),
    (["--hostfile", "{tmp}/noips.json"], "the ring backend needs \"ips\""),
    (["--ranks", "2", "--hostfile", "{tmp}/empty.json"], "alternatives"),
    (["--ranks", "2", "--distributed-backend", "mpi"], "needs --hostfile"),
    (["--ranks", "3"], "the model has 4 attention heads"), (["--pipeline"], "needs --ranks N"),
    (["--ranks", "2", "--pipeline"], "cannot split llama models by layers"),
    (["--hostfile", "{tmp}/deep.json"], "not JSON (nested more than 128 levels deep)"),
    (["--hostfile", "{tmp}/many.json"], "65 hosts, over the 64 ranks"),
])
def test_bad_distributed_input_is_one_line_exit_2_and_starts_nothing(home, tmp_path, args, needle):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "noips.json").write_text('[{"ssh": "a"}, {"ssh": "b"}]')
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "many.json").write_text(json.dumps([{"ssh": f"h{i}", "ips": ["10.0.0.1"]} for i in range(65)]))
    before = set(session_processes(os.getsid(0)))
    result = runner.invoke(app, ["serve", *(a.replace("{tmp}", str(tmp_path)) for a in args)])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1 and needle in errors[0], result.stderr
    assert "Traceback" not in result.stderr and set(session_processes(os.getsid(0))) <= before


def test_an_unreachable_host_stops_every_rank_in_one_line(home, tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]},
                                 {"ssh": "no-such-host.invalid", "ips": ["127.0.0.1"]}]))
    done = subprocess.run([sys.executable, "-m", "localchat", "serve", "--hostfile", str(hosts), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=120, start_new_session=True,
                          env={**os.environ, "LOCALCHAT_HOME": str(home)})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert "rank 1 exited with code 255 (ssh could not reach its host" in errors[0]


def test_dry_run_shows_the_command_and_starts_nothing(home):
    result = runner.invoke(app, ["serve", "--ranks", "2", "--dry-run"])
    assert result.exit_code == 0
    assert "mlx.launch --backend ring --hosts 127.0.0.1 -n 2 --starting-port" in result.stdout
    assert "-m localchat.serve.engine.rank_guard localchat.serve.engine.enforcing --model" in result.stdout
    assert "--pipeline" not in result.stdout
    plain = runner.invoke(app, ["serve", "--ranks", "2", "--dry-run", "--plain"])
    assert "-m localchat.serve.engine.rank_guard mlx_lm server --model" in plain.stdout


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory) -> Path:
    """A two-layer qwen2 model (an architecture mlx_lm 0.32 can split by layers; llama it cannot),
    random weights large enough that greedy text varies, the demo's tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2

    out, demo = tmp_path_factory.mktemp("qwen2"), Path(__file__).parents[1] / "localchat" / "demo_model"
    config = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 1185,
              "rope_theta": 10000.0, "tie_word_embeddings": True, "eos_token_id": 2}
    mx.random.seed(0)
    shapes = tree_flatten(qwen2.Model(qwen2.ModelArgs.from_dict(config)).parameters())
    weights = {k: mx.random.normal(v.shape) * 0.1 if v.ndim > 1 else v for k, v in shapes}
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(weights,
                                                                                              "model.safetensors")}))
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (out / name).write_bytes((demo / name).read_bytes())
    return out


def test_pipeline_splits_layers_where_mlx_lm_can_token_for_token(home, tiny_qwen2):
    dry = runner.invoke(app, ["serve", "-m", str(tiny_qwen2), "--ranks", "2", "--pipeline", "--dry-run"])
    assert dry.exit_code == 0 and dry.stdout.strip().endswith("--pipeline"), dry.stdout
    too_many = runner.invoke(app, ["serve", "-m", str(tiny_qwen2), "--ranks", "3", "--pipeline"])
    assert too_many.exit_code == 2 and "2 layers across the ranks: at most 2 ranks" in too_many.stderr
    result = runner.invoke(app, ["parity", "-m", str(tiny_qwen2), "--ranks", "2", "--pipeline", "--json"])
    report = json.loads(result.stdout)
    texts = [t["inproc_text"] for t in report["turns"]]
    assert result.exit_code == 0 and report["ok"] and texts == [t["server_text"] for t in report["turns"]]
    assert len(set(texts)) == len(texts) and all(len(set(t)) > 5 for t in texts)  # not one token repeated


def test_a_sigterm_whose_exception_was_lost_still_ends_the_wait_for_a_server():
    """Python drops an exception raised inside a finalizer (it only prints it), and a handler's
    exception can land there: the event stays set, and the next poll of a server raises it."""
    from localchat.errors import TerminationRequested, raise_on_sigterm
    from localchat.server.shown import heeding

    before, hook = signal.getsignal(signal.SIGTERM), sys.unraisablehook
    try:
        came = raise_on_sigterm()
        shown: list[str] = []
        on_poll = heeding(came, shown.append)
        on_poll("loading … 1s")
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # (the handler runs here)
        except TerminationRequested:
            pass  # lost, as inside a __del__
        assert came.is_set()
        with pytest.raises(TerminationRequested):
            on_poll("loading … 2s")
        assert shown == ["loading … 1s"]
    finally:
        signal.signal(signal.SIGTERM, before)
        sys.unraisablehook = hook
