import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import owned
from fake_hub import FakeHub, RunningHub, repo_from_dir
from localchat.demo_codes import MODEL_DIR
from machine_cache import machine_cache

ROOT = Path(__file__).resolve().parents[1]
DEMO_DIR = MODEL_DIR

os.environ["HF_HUB_OFFLINE"] = "1"
# No test writes to the user's data directory: the worker gets a directory of its own (what module
# fixtures start sees it), and each test one of its own again (``own_home``).
os.environ["LOCALCHAT_HOME"] = tempfile.mkdtemp(prefix="localchat-tests-home-")
atexit.register(shutil.rmtree, os.environ["LOCALCHAT_HOME"], ignore_errors=True)
os.environ["COLUMNS"] = "200"  # stable Rich output
# Bytecode is cached as Python does by default, even where the environment says not to (a CI image's
# PYTHONDONTWRITEBYTECODE=1): the suite starts ~700 Python processes, and without the cache each one
# compiles what it imports again (transformers, mlx_lm, localchat: `import mlx_lm` 1.7 s instead of 1.0).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
os.environ.pop("LOCALCHAT_MODELS", None)
# A run started in the background (`pytest &`, a CI step) begins with SIGINT ignored, and every child
# would inherit that: a Ctrl+C test would then prove nothing, or hang. Each worker catches it again
# (Python's own handler), so the processes the tests start get SIGINT's default action.
signal.signal(signal.SIGINT, signal.default_int_handler)


def _one_tls_context() -> None:
    """The tests' own top-level httpx calls (``httpx.get(…)``, ``httpx.post(…)``, ``httpx.stream(…)``)
    share one TLS context, as localchat's clients do (``backends.http.shared_ssl_context``): httpx
    builds one per call otherwise, reading the whole certificate store, 15-30 ms each: ~30 s of the
    workers' CPU over the suite, for calls to loopback ports. A call that names its own ``verify``
    keeps it."""
    import functools

    import httpx

    from localchat.backends.http import shared_ssl_context

    for name in ("request", "get", "post", "put", "patch", "delete", "stream"):
        setattr(httpx, name, functools.partial(getattr(httpx, name), verify=shared_ssl_context()))


_one_tls_context()


def _one_click_command() -> None:
    """Typer's test runner builds the click command again for each ``invoke``, reading the type hints
    of every command and option (~20 s of the workers' CPU over the suite): built once per app here,
    as ``localchat`` builds it once per process."""
    import functools

    import typer.testing

    typer.testing._get_command = functools.cache(typer.testing._get_command)


_one_click_command()


LOOK_ALIKES = (["sleep", "3600"],
               [sys.executable, "-c", "import time; time.sleep(3600)", "add_server.py", "mcp_server_time",
                "hostile_mcp.py", "localchat.mcp.guard", "mlx_lm server --model default_model",
                "localchat.serve.engine.enforcing", "localchat.pull.fetch", "mlx_vlm.server --model demo_vision_model"])


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    """Every test its own ``LOCALCHAT_HOME`` (a test's own fixture may set another)."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "localchat-home"))


@pytest.fixture(scope="session", autouse=True)
def a_users_own_processes():
    """Processes that look like the ones the tests start (a user's MCP servers, ``sleep``s and an
    mlx_lm server), unmarked: the suite must leave them alive (tests touch only what they started)."""
    decoys = [subprocess.Popen(argv, env=owned.unmarked_environment(), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for argv in LOOK_ALIKES]
    yield
    killed = [" ".join(d.args) for d in decoys if d.poll() is not None]
    for decoy in decoys:
        decoy.kill()
        decoy.wait()
    assert killed == [], f"the tests killed processes they did not start: {killed}"


@pytest.fixture(scope="session")
def demo():
    """The committed demo model, loaded once with the real mlx_lm.load."""
    from mlx_lm import load

    return load(str(DEMO_DIR))


@pytest.fixture(scope="session")
def demo_notes():
    """The bundled demo-notes model (the demo taught to keep notes), loaded once."""
    from mlx_lm import load

    return load(str(DEMO_DIR.parent / "demo_notes_model"))


@pytest.fixture
def demo_backend(demo):
    from localchat.backends.inproc import InProcessBackend

    model, tokenizer = demo
    return InProcessBackend(model, tokenizer, "demo")


@pytest.fixture
def broken_model(tmp_path):
    """The demo model with a model type no mlx_lm knows: its engine fails to load it, saying why."""
    import json

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in DEMO_DIR.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(config | {"model_type": "nosucharch"}))
    return broken


@pytest.fixture(scope="session")
def rambling_model(tmp_path_factory):
    """A tiny random-weight model that never ends its reply (for Ctrl+C and length tests)."""
    from demo.random_model import build_random_model

    return build_random_model(tmp_path_factory.mktemp("models") / "rambling", hidden=64, layers=1,
                              intermediate=128, heads=2)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct imported once per machine, keyed by its GGUF's hash (~2 s to redo)."""
    import hashlib

    from localchat.gguf.convert import import_gguf
    from localchat.gguf.package import package_file
    from localchat.registry import resolve

    source = package_file(resolve("smollm2").entry.source)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    with machine_cache(f"smollm2-{digest}") as cache:
        if not (cache / "config.json").is_file():
            shutil.rmtree(cache, ignore_errors=True)
            import_gguf(source, cache)
    return cache


# --- pull's Hub of our own (test_pull, test_pull_hostile) ---------------------------------------------


@pytest.fixture(scope="module")
def hub():
    fake = FakeHub()
    running = RunningHub(fake)
    yield running
    running.stop()


@pytest.fixture
def env(hub, tmp_path):
    """A fresh Hugging Face cache and localchat home; the hub serves a fresh copy of the demo."""
    hub.hub.repos.clear()
    hub.hub.repos["localchat-test/demo"] = repo_from_dir(MODEL_DIR)
    out = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    out |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "LOCALCHAT_HOME": str(tmp_path / "home"),
            "HF_HUB_DISABLE_TELEMETRY": "1"}
    return out


@pytest.hookimpl(optionalhook=True)  # (xdist's hook: unknown when pytest runs with -p no:xdist)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker a core and one more. Much of the suite waits (a model loading in a
    child, an idle unload, a server's start), so a third worker on two cores fills those waits
    (11:00 with three on this 2-core machine, 12:52 with two)."""
    return (os.cpu_count() or 1) + 1


# by their time in two whole runs here (longest first): a long file started last is the run's tail
LONGEST_FIRST = ("test_prompt_cache.py", "test_web.py", "test_pull.py", "test_router.py", "test_real_model.py",
                 "test_families.py", "test_pull_hostile.py", "test_server_enforcing.py", "test_vision.py",
                 "test_distributed.py", "test_kv_bits.py", "test_mcp.py", "test_metrics.py", "test_tool_limits.py",
                 "test_repl_pty.py", "test_conversation_log.py", "test_first_minutes.py", "test_bench.py",
                 "test_tool_families.py", "test_vision_circuit.py", "test_hostile_input.py", "test_faults.py",
                 "test_server_live.py", "test_grammar.py", "test_wheel.py", "test_trainer.py", "test_gateway_models.py",
                 "test_serve_hostile.py", "test_load.py")


def pytest_collection_modifyitems(config, items):
    """The files that take longest run first (each file stays on one worker: ``--dist loadfile``),
    so the run does not end waiting on one long file started last."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))
