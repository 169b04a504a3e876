"""The fault corpus of the newer surfaces: import (GGUF values, names, ollama, write failures,
signals), chat templates, the model registry, load, standard output, and the API key.

Every case asserts its exit code, exactly one ``error:`` line naming what happened, no traceback,
the key nowhere, and no debris: no half-imported model, no temporary file, no registry entry for a
model that is not there. Fixtures are built by the tests (synthetic GGUFs, copies of the demo).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fakeserver import USAGE, FakeServer, Reply, delta, sse
from gguf_reference import write_tiny_gguf
from localchat.cli.app import app
from localchat.demo_codes import MODEL_DIR

runner = CliRunner()
CANARY = "sk-CANARY-7f3a9c1e5b"
V = gguf.GGUFValueType


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LOCALCHAT_API_KEY", raising=False)
    return tmp_path / "home"


def one_error(result, code: int, needle: str) -> str:
    output = result.stdout + result.stderr
    assert result.exit_code == code, output
    assert "Traceback" not in output and CANARY not in output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert needle in errors[0], errors[0]
    return errors[0]


def no_debris(home: Path, name: str = "x") -> None:
    """Nothing of a failed import: no model directory, no staging directory, no temporary file,
    no registry entry."""
    models = home / "models"
    assert not (models / name).exists()
    assert not models.exists() or [p.name for p in models.iterdir()] == []
    assert not list(home.glob(".*.tmp")) if home.exists() else True
    if (home / "models.yaml").is_file():
        assert name not in (home / "models.yaml").read_text()


def imported(path: Path, *args: str):
    return runner.invoke(app, ["import", str(path), "--name", "x", *args])


# --- 1 and 3: GGUF values that cannot be trusted, metadata that contradicts the tensors --------------

def kv(key: str, value, vtype, sub_type=None):
    def mutate(writer):
        writer.kv_data[0][key] = gguf.GGUFValue(value, vtype, sub_type)
    return mutate


def drop(*keys: str):
    def mutate(writer):
        for key in keys:
            writer.kv_data[0].pop(key)
    return mutate


def tensors(change):
    def mutate(writer):
        writer.tensors[0] = change(dict(writer.tensors[0]))
    return mutate


def retyped(name: str, rows: int):
    def change(infos):
        info = infos[name]
        raw = np.zeros((rows, info.shape[-1]), np.float32) if rows else np.zeros((1,), np.float32)
        infos[name] = gguf.gguf_writer.TensorInfo(shape=raw.shape, dtype=gguf.GGMLQuantizationType.F32,
                                                  nbytes=raw.nbytes, tensor=raw)
        return infos
    return change


METADATA = {
    "alignment 0": (kv("general.alignment", 0, V.UINT32), "general.alignment 0 is not a power of two"),
    "alignment 3": (kv("general.alignment", 3, V.UINT32), "general.alignment 3"),
    "alignment text": (kv("general.alignment", "32", V.STRING), "general.alignment '32'"),
    "nested arrays": (kv("general.tags", [[["deep"]]], V.ARRAY), "nests arrays too deep"),
    "head_count 0": (kv("llama.attention.head_count", 0, V.UINT32), "'llama.attention.head_count' is 0"),
    "head_count text": (kv("llama.attention.head_count", "4", V.STRING), "'llama.attention.head_count' is '4'"),
    "heads do not divide": (
        lambda w: [
            kv("llama.attention.head_count", 5, V.UINT32)(w),
            kv("llama.attention.head_count_kv", 5, V.UINT32)(w),
        ],
        "5 attention heads do not divide the width 64",
    ),
    "kv heads do not divide": (kv("llama.attention.head_count_kv", 3, V.UINT32), "cannot share 3 key/value heads"),
    "tokens of numbers": (kv("tokenizer.ggml.tokens", [1, 2, 3], V.ARRAY), "'tokenizer.ggml.tokens' must be a list"),
    "merges of numbers": (kv("tokenizer.ggml.merges", [7, 8], V.ARRAY), "'tokenizer.ggml.merges' must be a list"),
    "merges of unknown tokens": (kv("tokenizer.ggml.merges", ["zz qq"], V.ARRAY), "the merge 'zz qq' names tokens"),
    "token types too few": (kv("tokenizer.ggml.token_type", [1, 1], V.ARRAY), "has 2 entries for"),
    "bos out of range": (kv("tokenizer.ggml.bos_token_id", 99999, V.UINT32), "bos_token_id' is 99999"),
    "epsilon as text": (
        kv("llama.attention.layer_norm_rms_epsilon", "1e-5", V.STRING),
        "layer_norm_rms_epsilon' is '1e-5'",
    ),
    "epsilon 0": (kv("llama.attention.layer_norm_rms_epsilon", 0.0, V.FLOAT32), "layer_norm_rms_epsilon' is 0.0"),
    "block_count 1e9": (kv("llama.block_count", 10**9, V.UINT32), "'llama.block_count' is 1000000000"),
    "block_count 0": (kv("llama.block_count", 0, V.UINT32), "'llama.block_count' is 0"),
    "width 2^20": (kv("llama.embedding_length", 1 << 20, V.UINT32), "'llama.embedding_length' is 1048576"),
    "context negative": (kv("llama.context_length", -5, V.INT32), "'llama.context_length' is -5"),
    "rope base 0": (kv("llama.rope.freq_base", 0.0, V.FLOAT32), "'llama.rope.freq_base' is 0.0"),
    "add_bos as text": (kv("tokenizer.ggml.add_bos_token", "yes", V.STRING), "must be true or false"),
    "no block_count": (drop("llama.block_count"), "the file has no 'llama.block_count'"),
    "no tokens": (drop("tokenizer.ggml.tokens"), "the file has no 'tokenizer.ggml.tokens'"),
    "template not text": (kv("tokenizer.chat_template", 5, V.UINT32), "'tokenizer.chat_template' is 5"),
    "no tensors": (tensors(lambda infos: {}), "has no tensor 'token_embd.weight'"),
    "a missing block tensor": (
        tensors(lambda infos: {k: v for k, v in infos.items() if k != "blk.1.ffn_up.weight"}),
        "has no tensor 'blk.1.ffn_up.weight'",
    ),
    "one block too few": (kv("llama.block_count", 3, V.UINT32), "has no tensor 'blk.2."),
    "one block too many": (kv("llama.block_count", 1, V.UINT32), "'blk.1.attn_norm.weight' has no place"),
    "embedding of the wrong size": (
        tensors(retyped("token_embd.weight", 7)),
        "'token_embd.weight' has the shape (7, 64)",
    ),
    "a scalar embedding": (tensors(retyped("token_embd.weight", 0)), "'token_embd.weight' has the shape (1,)"),
    "an unknown tensor": (
        tensors(lambda infos: infos | {"blk.0.attn_zz.weight": replace(infos["blk.0.attn_norm.weight"])}),
        "'blk.0.attn_zz.weight' has no place",
    ),
}


@pytest.mark.parametrize("case", sorted(METADATA))
def test_gguf_values_are_checked_before_anything_is_written(case, tmp_path, home):
    mutate, needle = METADATA[case]
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32", mutate=mutate)
    one_error(imported(tmp_path / "m.gguf"), 1, needle)
    no_debris(home)


def test_a_duplicated_tensor_name_is_refused(tmp_path, home):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, "llama", "F32")
    data = path.read_bytes()
    first = data.index(b"blk.1.attn_norm.weight")
    path.write_bytes(data[:first] + b"blk.0.attn_norm.weight" + data[first + 22:])  # same length, now twice
    one_error(imported(path), 1, "tensor 'blk.0.attn_norm.weight' appears more than once")
    no_debris(home)


# --- 2: the real error, not the cleanup's ----------------------------------------------------------

def test_a_type_that_cannot_be_imported_is_named_not_hidden_by_cleanup(tmp_path, home):
    def q2_k(writer):
        raw = np.zeros((128, 84), np.uint8)  # 128 rows of one Q2_K block (256 values, 84 bytes)
        writer.tensors[0].pop("blk.0.ffn_gate.weight")
        writer.add_tensor("blk.0.ffn_gate.weight", raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.Q2_K)

    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32", hidden=256, mutate=q2_k)
    result = imported(tmp_path / "m.gguf")
    assert "BufferError" not in result.stderr
    one_error(result, 1, "tensor type Q2_K cannot be imported")
    no_debris(home)


@pytest.mark.parametrize("kind, name, damage", [
    ("Q8_0", "blk.0.ffn_up.weight", lambda raw: raw[0].__setitem__(slice(0, 2), [0x00, 0x7C])),  # scale f16 inf
    ("Q4_K", "blk.1.attn_v.weight", lambda raw: raw[0].__setitem__(slice(2, 4), [0x00, 0x7E])),  # dmin f16 NaN
    ("F32", "blk.0.attn_norm.weight", lambda raw: raw.__setitem__(3, np.nan)),
])
def test_a_tensor_with_numbers_that_are_not_finite_is_refused(tmp_path, home, kind, name, damage):
    """A damaged or hostile file's inf or NaN (a scale of 0x7C00) would import silently into a model
    that answers garbage: it is one line naming the tensor, and nothing is written."""
    def damaged(writer):
        info = writer.tensors[0][name]
        raw = info.tensor.copy()
        damage(raw)
        writer.tensors[0][name] = replace(info, tensor=raw)

    write_tiny_gguf(tmp_path / "m.gguf", "llama", kind, hidden=256, ffn=256, mutate=damaged)
    result = imported(tmp_path / "m.gguf")
    assert "RuntimeWarning" not in result.stderr
    one_error(result, 1, f"tensor {name} holds {'1 number' if kind == 'F32' else ''}")
    assert "not finite (inf or NaN): the file is damaged" in result.stderr
    no_debris(home)


@pytest.mark.parametrize("signal_name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_or_sigterm_during_import_leaves_nothing(tmp_path, home, monkeypatch, signal_name, code):
    from localchat.gguf import convert

    write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q8_0")
    real, calls = convert.to_mlx, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), getattr(signal, signal_name))
        return real(*args)

    monkeypatch.setattr(convert, "to_mlx", interrupted)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        result = imported(tmp_path / "m.gguf")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == code and "Traceback" not in result.stderr, result.stderr
    no_debris(home)


# --- 4: hostile or broken chat templates, at import and at chat time --------------------------------

TEMPLATES = {
    "raises": ("{{ raise_exception('go away') }}", "it refused these messages: go away"),
    "does not parse": ("{% for m in messages %}{{ m.content }", "it does not parse"),
    "undefined call": ("{{ nosuch() }}", "it failed: UndefinedError"),
    "sandbox": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "it failed: SecurityError"),
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "it rendered for over 0.5s"),
}


@pytest.fixture
def quick_limit(monkeypatch):
    from localchat.templates import limits

    monkeypatch.setattr(limits, "RENDER_LIMIT_S", 0.5)


@pytest.mark.parametrize("case", sorted(TEMPLATES))
def test_a_broken_template_is_refused_at_import(case, tmp_path, home, quick_limit):
    template, needle = TEMPLATES[case]
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32", mutate=kv("tokenizer.chat_template", template, V.STRING))
    one_error(imported(tmp_path / "m.gguf"), 1, needle)
    no_debris(home)


@pytest.mark.parametrize("case", sorted(TEMPLATES))
def test_a_broken_template_is_one_line_at_chat_time(case, tmp_path, home, quick_limit):
    model = tmp_path / "broken"
    model.mkdir()
    for f in MODEL_DIR.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    (model / "chat_template.jinja").write_text(TEMPLATES[case][0])
    result = runner.invoke(app, ["chat", "-m", str(model), "hello"])
    one_error(result, 1, f"{model}'s chat template: {TEMPLATES[case][1]}")


# --- 5, 6: names ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "x\n", "../x", ".hidden", "a" * 65, "a/b", "x y", "-x"])
def test_model_names_are_whole_and_plain(name, tmp_path, home):
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32")
    result = runner.invoke(app, ["import", str(tmp_path / "m.gguf"), "--name", name])
    one_error(result, 2, "invalid model name")
    assert not (home / "models").exists()


@pytest.fixture
def ollama(tmp_path, monkeypatch):
    store = tmp_path / "ollama"
    (store / "blobs").mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    return store


def manifest(store: Path, body, name="m", tag="latest") -> Path:
    path = store / "manifests" / "registry.ollama.ai" / "library" / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


@pytest.mark.parametrize("model, code, needle", [
    ("", 2, "is not an ollama model name"),
    ("../../../outside/evil", 2, "is not an ollama model name"),
    ("ns/../../evil", 2, "is not an ollama model name"),
    ("a:b:c", 2, "is not an ollama model name"),
    ("m:../x", 2, "is not an ollama model name"),
    ("nosuch", 2, "ollama has no model 'nosuch'"),
])
def test_ollama_names_follow_its_grammar_and_stay_in_the_store(model, code, needle, home, ollama):
    one_error(runner.invoke(app, ["import", "--from-ollama", model]), code, needle)


@pytest.mark.parametrize("body, needle", [
    ({"layers": "nope"}, "has no list of layers"),
    ({"layers": None}, "has no list of layers"),
    ([1, 2], "has no list of layers"),
    ("not json", "cannot read ollama's manifest"),
    ({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:../../x"}]},
     "names no model layer"),
    ({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "ab" * 32}]},
     "is missing"),
])
def test_a_damaged_ollama_manifest_is_one_line(body, needle, home, ollama):
    manifest(ollama, body)
    one_error(runner.invoke(app, ["import", "--from-ollama", "m"]), 1, needle)
    no_debris(home, "m")


def test_a_manifest_symlinked_out_of_the_store_is_refused(home, ollama, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"layers": []}))
    path = manifest(ollama, "{}")
    path.unlink()
    path.symlink_to(outside)
    one_error(runner.invoke(app, ["import", "--from-ollama", "m"]), 2, "leads outside ollama's store")


# --- 7, 8: write failures and concurrent imports ------------------------------------------------------

def no_space(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_no_space_for_the_weights_is_one_line_and_no_debris(tmp_path, home, monkeypatch):
    from localchat.gguf import convert

    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32")
    monkeypatch.setattr(convert, "write_shards", no_space)
    one_error(imported(tmp_path / "m.gguf"), 1, "No space left on device; nothing was imported")
    no_debris(home)


def test_no_space_for_the_registry_takes_the_model_away_again(tmp_path, home, monkeypatch):
    from localchat import files

    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32")
    monkeypatch.setattr(files.os, "fsync", no_space)
    one_error(imported(tmp_path / "m.gguf"), 1, "cannot write the model registry")
    no_debris(home)


def test_a_registry_that_is_a_directory_is_named_and_left_alone(tmp_path, home):
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32")
    (home / "models.yaml").mkdir(parents=True)
    one_error(imported(tmp_path / "m.gguf"), 1, "is not a file")
    assert (home / "models.yaml").is_dir()
    no_debris(home)


def test_a_home_that_cannot_be_made_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "file" / "home"))
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32")
    one_error(imported(tmp_path / "m.gguf"), 1, "Not a directory")


def test_an_import_of_the_same_name_that_finishes_first_wins_cleanly(tmp_path, home, monkeypatch):
    from localchat.gguf import convert

    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32")
    real = convert.to_mlx

    def other_import_lands(*args):
        other = home / "models" / "x"
        if not other.exists():
            other.mkdir(parents=True)
            (other / "config.json").write_text("{}")
        return real(*args)

    monkeypatch.setattr(convert, "to_mlx", other_import_lands)
    one_error(imported(tmp_path / "m.gguf"), 1, "nothing was imported")
    assert [p.name for p in (home / "models").iterdir()] == ["x"]  # the other one, untouched
    assert (home / "models" / "x" / "config.json").read_text() == "{}"


def test_imports_at_once_lose_no_registry_entry(home):
    from localchat.store.user_models import add_user_model

    names = [f"m{i}" for i in range(12)]
    threads = [threading.Thread(target=add_user_model, args=({"id": n, "source": f"/x/{n}"},)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    from localchat.registry import read_registry_file

    assert sorted(e.id for e in read_registry_file(home / "models.yaml")) == sorted(names)
    assert not list(home.glob(".models.yaml.*.tmp"))


# --- 10, 11: load options and outputs -----------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--think-time", "inf"], "--think-time"), (["--think-time", "1e300"], "--think-time"),
    (["--think-time", "nan"], "--think-time"), (["--think-time", "-1"], "--think-time"),
    (["--sweep", ""], "--sweep"), (["--sweep", "0"], "--sweep"), (["--sweep", "1,,2"], "--sweep"),
    (["--sweep", "9" * 30], "--sweep"), (["--sweep", "2,2"], "--sweep"),
])
def test_load_refuses_values_it_cannot_run(args, needle, home):
    one_error(runner.invoke(app, ["load", "--base-url", "http://127.0.0.1:9/v1", *args]), 2, needle)


@pytest.fixture
def good_server():
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(delta("OK", "stop"), {"choices": [], "usage": USAGE})))
    fake.replies["/v1/models"] = Reply(chunks=[b'{"data": []}'], headers={"Content-Type": "application/json"})
    yield fake
    fake.close()


def test_load_on_a_full_disk_writes_no_half_file(good_server, tmp_path, home, monkeypatch):
    from localchat import files

    out = tmp_path / "out"
    monkeypatch.setattr(files.os, "fsync", no_space)
    result = runner.invoke(app, ["load", "--base-url", good_server.base_url, "--warmup", "0", "--conversations", "1",
                                 "--history", "on", "--out", str(out)])
    one_error(result, 1, "cannot write")
    assert not list(out.glob("*.json")) and not list(out.glob(".*.tmp"))


def test_ctrl_c_during_the_warm_up_writes_partial_results(good_server, tmp_path, home, monkeypatch):
    from localchat.load import run

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(run.Run, "execute", interrupted)
    out = tmp_path / "out"
    result = runner.invoke(app, ["load", "--base-url", good_server.base_url, "--out", str(out)])
    assert result.exit_code == 130 and "Traceback" not in result.stderr
    data = json.loads((out / "results.json").read_text())
    assert data["partial"] is True and data["runs"] == []


# --- 12: standard output that fails --------------------------------------------------------------------

def saved_session(home: Path, text: str = "港口 17") -> None:
    from localchat.conversation.history import Turn
    from localchat.store.saved_sessions import SavedSession, SessionStore

    SessionStore(home / "sessions.sqlite3").save(SavedSession(
        name="s", uid="u", model="demo", backend="inproc", system=None, params={}, turns=(Turn("hi", text),)))


def shell(command: str, home: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LOCALCHAT_HOME": str(home), **env})


PY = f"{sys.executable} -m localchat"


@pytest.mark.parametrize("command, env, needle", [
    (f"{PY} sessions export s > /dev/full", {}, "cannot write to standard output: No space left on device"),
    (f"{PY} sessions export s --format json > /dev/full", {}, "No space left on device"),
    (f"{PY} models > /dev/full", {}, "No space left on device"),
    (f"{PY} sessions export s >&-", {}, "standard output is closed"),
    (f"{PY} models >&-", {}, "standard output is closed"),
    (f"{PY} sessions export s", {"PYTHONIOENCODING": "ascii"}, "standard output (ascii) cannot encode"),
    (f"{PY} sessions show s", {"PYTHONIOENCODING": "ascii"}, "standard output (ascii) cannot encode"),
])
def test_a_stdout_that_cannot_take_the_text_is_one_line(command, env, needle, home):
    saved_session(home)
    done = shell(command, home, **env)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0] and "Traceback" not in done.stderr, done.stderr


# --- 13: the key, wherever a server echoes it -----------------------------------------------------------

@pytest.mark.parametrize("cut", [1, 5, 10, len(CANARY) - 1])
def test_a_key_echoed_across_chunks_is_cut_out_of_everything(cut, home, tmp_path):
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(
        {"choices": [{"index": 0, "delta": {"reasoning": "I saw " + CANARY[:cut]}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": CANARY[cut:] + " there"}}]},
        delta("the key is " + CANARY[:cut]), delta(CANARY[cut:] + ".", "stop"), {"choices": [], "usage": USAGE})))
    try:
        records = tmp_path / "records"
        result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", fake.base_url, "--api-key", CANARY,
                                     "--show-thinking", "--record", str(records)], input="hello\n/save keyed\n")
    finally:
        fake.close()
    assert result.exit_code == 0, result.stderr
    assert "the key is [api key]." in result.stdout and "I saw [api key] there" in result.stderr
    everything = result.stdout + result.stderr + "".join(p.read_text() for p in records.glob("*.json"))
    everything += runner.invoke(app, ["sessions", "export", "keyed", "--format", "json"]).stdout
    assert CANARY not in everything and CANARY[:cut] + CANARY[cut:] not in everything


@pytest.mark.parametrize("command", [["chat", "hi", "--backend", "server"], ["smoke"], ["doctor"],
                                     ["load"], ["bench", "--backend", "server"]])
def test_credentials_in_a_url_are_refused_and_never_shown(command, home):
    result = runner.invoke(app, [*command, "--base-url", f"http://me:{CANARY}@127.0.0.1:9/v1"])
    one_error(result, 2, "pass the key with --api-key")


# --- 14: the server's log ---------------------------------------------------------------------------

def test_a_planted_log_symlink_is_not_followed(tmp_path):
    from localchat.server.launch import ServerStartError, launch

    target = tmp_path / "victim"
    target.write_text("precious")
    log = tmp_path / "logs" / "server.log"
    log.parent.mkdir()
    log.symlink_to(target)
    with pytest.raises(ServerStartError, match="cannot open the server log"):
        launch(str(MODEL_DIR), port=1, log_path=log)
    assert target.read_text() == "precious"


# --- the GGUF reader against damaged files: a model or one LocalchatError, in bounded time -----------------

@pytest.fixture(scope="module")
def valid_gguf(tmp_path_factory) -> tuple[bytes, list[int]]:
    """A small valid file, and the offsets of every 64-bit count, length, dimension and offset in it."""
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    write_tiny_gguf(path, "qwen2", "Q8_0", hidden=32, layers=1, heads=2, kv_heads=1, ffn=64)
    reader = gguf.GGUFReader(str(path))
    base = reader.data.ctypes.data
    fields = [*reader.fields.values(), *(t.field for t in reader.tensors)]
    numbers = [
        part.ctypes.data - base for f in fields for part in f.parts if part.dtype == np.uint64 and part.size == 1
    ]
    return path.read_bytes(), sorted({8, 16, *numbers})


MUTATIONS = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 4095), st.integers(1, 255)), min_size=1, max_size=8)),
    st.tuples(st.just("count"), st.integers(0, 10**6), st.sampled_from([0, 1, 2**31, 2**32, 2**63, 2**64 - 1])),
)


def damaged(data: bytes, numbers: list[int], mutation) -> bytes:
    kind, *how = mutation
    out = bytearray(data)
    if kind == "truncate":
        return bytes(out[:int(how[0] * len(data))])
    if kind == "flip":
        for at, bits in how[0]:
            out[at % len(out)] ^= bits
        return bytes(out)
    at = numbers[how[0] % len(numbers)]
    out[at:at + 8] = how[1].to_bytes(8, "little")
    return bytes(out)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=MUTATIONS)
def test_damaged_files_give_a_model_or_one_error(valid_gguf, mutation):
    """Truncated, bytes flipped, counts and lengths changed: an imported model, or one
    ``LocalchatError`` line and nothing written, within seconds (no huge allocation, no hang)."""
    import tempfile
    import time

    from localchat.errors import LocalchatError
    from localchat.gguf.convert import import_gguf

    data, numbers = valid_gguf
    with tempfile.TemporaryDirectory() as tmp:
        source, destination = Path(tmp) / "m.gguf", Path(tmp) / "models" / "m"
        source.write_bytes(damaged(data, numbers, mutation))
        started = time.monotonic()
        try:
            import_gguf(source, destination)
        except LocalchatError as exc:
            assert str(exc) and "\n" not in str(exc)
            assert not destination.exists()
        assert time.monotonic() - started < 30
        assert not list(destination.parent.glob(".*")) if destination.parent.exists() else True


def test_a_runaway_template_is_stopped_in_a_worker_thread_too(quick_limit):
    """load's simulated users render in threads, where no alarm signal can reach: traced instead."""
    from mlx_lm.utils import load_tokenizer

    from localchat.templates.render import ChatTemplate, TemplateError

    tokenizer = load_tokenizer(MODEL_DIR)
    tokenizer._tokenizer.chat_template = TEMPLATES["nested loops"][0]
    caught = []

    def render():
        try:
            ChatTemplate(tokenizer, "looping").text([{"role": "user", "content": "hi"}])
        except TemplateError as exc:
            caught.append(str(exc))

    worker = threading.Thread(target=render)
    worker.start()
    worker.join(30)
    assert not worker.is_alive() and caught == ["looping's chat template: it rendered for over 0.5s (a runaway "
                                                "template?)"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 1 MiB file system (tmpfs), where one is allowed to be mounted here (root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_an_import_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, tiny_disk, monkeypatch):
    """The tokenizer fits, the weights (3 MB) do not: MLX's own writer fails, in one line, the
    partial model directory goes, nothing is registered."""
    home = tiny_disk / "home"
    monkeypatch.setenv("LOCALCHAT_HOME", str(home))
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "F32", hidden=256, ffn=1024)
    error = one_error(imported(tmp_path / "m.gguf"), 1, "cannot write")
    assert "nothing was imported" in error
    no_debris(home)
