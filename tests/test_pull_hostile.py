"""A Hub, a cache or a header that is not what it should be: each is one line and a non-zero exit
before a byte of weights moves, never a traceback, a hang or a file outside the cache."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_hub import repo_from_dir
from localchat.demo_codes import MODEL_DIR
from test_pull import DEMO, error_line, filler_weights, localchat, wait_for_weights


def hf_files(env) -> list[Path]:
    root = Path(env["HF_HOME"])
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def weights_with(transform) -> bytes:
    """The demo's weights with their header's tensors rewritten by ``transform(tensors)``."""
    data = (MODEL_DIR / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    transform(header)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + size:]


@pytest.mark.parametrize("name", ["../evil.json", "/etc/evil.json", "a/../../evil.json", "x\x1b]0;owned\x07.json",
                                  "a\\..\\evil.json", "line\nbreak.json"])
def test_a_listed_file_outside_the_repo_is_refused(env, hub, name):
    hub.hub.repos[DEMO].siblings = [{"rfilename": name, "size": 10}]
    result = localchat(env, "pull", DEMO)
    assert result.returncode == 1 and "not a path inside a repo" in error_line(result)
    assert "\x1b" not in result.stderr and hf_files(env) == []


@pytest.mark.parametrize("size", ["abc", "@raw:1e400@", "@raw:NaN@", "@raw:-Infinity@", -5, 1.5, 10**400, [1]])
def test_a_size_that_is_not_a_number_of_bytes_is_refused(env, hub, size):
    hub.hub.repos[DEMO].siblings = [{"rfilename": "extra.json", "size": size}]
    result = localchat(env, "pull", DEMO, "--dry-run")
    assert result.returncode == 1 and "not a number of bytes" in error_line(result)


@pytest.mark.parametrize("offsets", [["0", "10"], [10**15, 0], [0, 10**18], [5], None, [-1, 3], [0.5, 8]])
def test_a_header_whose_byte_ranges_are_not_ranges_is_refused(env, hub, offsets):
    def damage(header):
        name = next(k for k in header if k != "__metadata__")
        header[name]["data_offsets"] = offsets

    hub.hub.repos[DEMO].files["model.safetensors"] = weights_with(damage)
    result = localchat(env, "pull", DEMO, "--dry-run")
    assert result.returncode == 1, result.stderr
    line = error_line(result)
    assert "which is not one" in line or "cannot read the safetensors header" in line
    assert hf_files(env) == []


def test_an_unknown_dtype_is_estimated_from_its_bytes(env, hub):
    def fp8_scales(header):
        for name, tensor in header.items():
            if name.endswith(".scales"):
                tensor["dtype"] = "F8_E4M3"

    hub.hub.repos[DEMO].files["model.safetensors"] = weights_with(fp8_scales)
    result = localchat(env, "pull", DEMO, "--dry-run")
    assert result.returncode == 0 and "fits" in result.stderr, result.stderr


@pytest.mark.parametrize("key, value", [("num_hidden_layers", 10**15), ("vocab_size", 10**400),
                                        ("hidden_size", "@raw:Infinity@"), ("num_attention_heads", 2**70)])
def test_a_config_past_any_model_is_refused_at_once(env, hub, key, value):
    config = json.loads((MODEL_DIR / "config.json").read_text())
    config[key] = value
    text = json.dumps(config).replace('"@raw:Infinity@"', "Infinity")
    hub.hub.repos[DEMO].files["config.json"] = text.encode()
    started = time.monotonic()
    result = localchat(env, "pull", DEMO, "--dry-run", timeout=60)
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < 30
    assert "past any model's" in error_line(result) or "cannot read its config.json" in error_line(result)


def test_a_hub_that_trickles_its_answer_is_given_up_on_as_a_whole(env, hub):
    hub.hub.repos[DEMO].trickle_s = 0.05  # a byte every 50 ms: each read is quick, the answer takes minutes
    started = time.monotonic()
    result = localchat(env | {"HF_HUB_DOWNLOAD_TIMEOUT": "1"}, "pull", DEMO, timeout=60)
    assert result.returncode == 1 and "did not finish answering within 6 s" in error_line(result)
    assert time.monotonic() - started < 30


def test_a_refused_dry_run_of_a_sharded_repo_writes_nothing_and_draws_no_bar_of_the_client(env, hub):
    """The index of a sharded repo is not read (each shard's header is): nothing lands in the cache."""
    repo = repo_from_dir(MODEL_DIR)
    repo.files["model-00001-of-00002.safetensors"] = repo.files.pop("model.safetensors")
    repo.files["model-00002-of-00002.safetensors"] = filler_weights(4096)
    repo.files["model.safetensors.index.json"] = json.dumps(
        {"weight_map": {"filler": "model-00002-of-00002.safetensors"}}
    ).encode()
    hub.hub.repos[DEMO] = repo
    for extra in ([], ["--memory-limit", "1MB"]):
        result = localchat(env, "pull", DEMO, "--dry-run", *extra)
        assert result.returncode == (1 if extra else 0), result.stderr
        assert "Parse safetensors" not in result.stdout + result.stderr
        assert hf_files(env) == []
    listing = localchat(env, "pull", DEMO, "--dry-run").stderr
    for name in ("model-00001-of-00002.safetensors", "model.safetensors.index.json", "config.json"):
        assert f"    {name}" in listing and "to fetch" in listing, listing


def test_a_fifo_in_the_cache_is_named_not_waited_on(env, hub):
    assert localchat(env, "pull", DEMO).returncode == 0
    snapshot = next((Path(env["HF_HOME"]) / "hub").glob("models--*/snapshots/*"))
    (snapshot / "model.safetensors").unlink()
    os.mkfifo(snapshot / "model.safetensors")
    listed = localchat(env, "models", timeout=60)
    assert listed.returncode == 0 and DEMO in listed.stdout, listed.stderr
    chat = localchat(env, "chat", "-m", DEMO, "hi", timeout=60)
    assert chat.returncode == 1 and "not a regular file" in error_line(chat)


def test_sigterm_mid_pull_exits_143_and_keeps_what_finished(env, hub):
    hub.hub.repos[DEMO].rate = 50_000
    process = subprocess.Popen([sys.executable, "-m", "localchat", "pull", DEMO], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_weights(hub, process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=10)
    assert process.returncode == 143, err
    assert "terminated" in err and "Traceback" not in err


@pytest.mark.parametrize("limit", ["9" * 400, "1e400GB", "nan GB"])
def test_a_memory_limit_past_any_machine_is_one_usage_line(env, hub, limit):
    result = localchat(env, "pull", DEMO, "--dry-run", "--memory-limit", limit)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
