"""The wheel works on its own: built with ``uv build``, installed into a fresh virtualenv outside
the repo, and run from a directory outside the repo (built-in bench scripts, bundled model)."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from localchat.server.launch import free_port

pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    where = tmp_path_factory.mktemp("wheel")
    subprocess.run(["uv", "build", "--wheel", "--out-dir", str(where / "dist"), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((where / "dist").glob("localchat-*.whl"))
    subprocess.run(["uv", "venv", "--python", sys.executable, str(where / "venv")],
                   check=True, capture_output=True, timeout=120)
    subprocess.run(["uv", "pip", "install", "--python", str(where / "venv" / "bin" / "python"), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    outside = where / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "LOCALCHAT_MODELS")}
    env |= {"LOCALCHAT_HOME": str(where / "home"), "HF_HUB_OFFLINE": "1", "COLUMNS": "80"}

    def run(*args, timeout=300):
        return subprocess.run([str(where / "venv" / "bin" / "localchat"), *args], cwd=outside, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return run, where


def test_the_wheel_holds_the_package_and_not_the_trainer(installed):
    _, where = installed
    names = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(next((where / "dist").glob("*.whl")))],
                           capture_output=True, text=True, check=True).stdout
    assert "localchat/models.yaml" in names and "localchat/demo_model/model.safetensors" in names
    assert "localchat/bench/scripts/recall-en.yaml" in names and "localchat/demo_notes_model/model.safetensors" in names
    assert (
        "localchat/demo_tools_model/model.safetensors" in names and "localchat/bench/scripts/tools/sums.yaml" in names
    )
    assert "demo/train.py" not in names and "scripts/" not in names.replace("bench/scripts/", "")


def test_installed_localchat_chats_benches_serves_and_lists(installed):
    run, where = installed
    site = run("doctor")
    assert site.returncode == 0, site.stderr

    chat = run("chat", "Remember the code harbor 17. Reply only OK.")
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.strip() == "OK"

    bench = run("bench", "-m", "demo", "--history", "both", "--format", "json")
    assert bench.returncode == 0, bench.stderr
    import json

    report = json.loads(bench.stdout)
    scripts = {os.path.basename(p) for p in report["settings"]["scripts"]}
    assert {"recall-en.yaml", "recall-zh.yaml"} <= scripts
    assert all(str(ROOT) not in p for p in report["settings"]["scripts"])
    arms = report["summary"]["arms"]
    assert arms["inproc history-on"]["accuracy"] > arms["inproc history-off"]["accuracy"]

    smoke = run("serve", "--smoke", "--port", str(free_port()))
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "all required checks passed" in smoke.stdout

    models = run("models")
    assert models.returncode == 0 and models.stdout.startswith("demo (default, tiny) · demo family · present")
    assert str(where / "venv") in models.stdout  # the registry is the installed package's own
