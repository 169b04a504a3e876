"""The engine's one seam into mlx_lm (``serve/engine/seam.py``): each part checked as a unit against
modules made here (a name gone, parameters reordered, a field gone, code that no longer does what
the engine relies on), and a real engine refusing to start, in one line that names mlx-lm's version
and the part, when one name is hidden from the installed mlx_lm."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from localchat.serve.engine import seam
from localchat.serve.engine.seam import Part


def module_with(**names) -> types.ModuleType:
    made = types.ModuleType("fake_mlx_lm")
    made.__dict__.update(names)
    return made


class Handler:
    def handle_completion(self, request, stop_words):
        return self.response_generator.generate(request)


@dataclasses.dataclass
class Request:
    tools: list


def checked(part: Part, module: types.ModuleType) -> str | None:
    return seam.missing(part, lambda name: module)


def test_each_kind_of_part_is_checked_and_its_absence_named():
    module = module_with(Handler=Handler, Request=Request, make=lambda args, tokenizer: None)
    assert checked(Part("m", "make", params=("args", "tokenizer")), module) is None
    assert checked(Part("m", "make", params=("tokenizer", "args")), module) == "it takes (args, tokenizer)"
    assert checked(Part("m", "gone"), module) == "it is not there"
    assert checked(Part("m", "Handler.handle_completion", params=("request", "stop_words")), module) is None
    assert checked(Part("m", "Handler.handle_completion", holds="generate(request"), module) is None
    assert checked(Part("m", "Handler.handle_completion", holds="_make_sampler(args"), module) == \
        "it no longer does that"
    assert checked(Part("m", "Request", fields=("tools",)), module) is None
    assert checked(Part("m", "Request", fields=("tools", "enforce")), module) == "its fields differ"


def test_the_refusal_is_one_line_naming_the_version_and_the_part():
    with pytest.raises(seam.SeamBroken) as broken:
        seam.check((Part("mlx_lm.server", "_make_sampler_renamed", params=("args",)),))
    line = str(broken.value.code)
    assert "\n" not in line and "_make_sampler_renamed(args)" in line and seam.installed_version() in line
    assert "serve --plain" in line


def test_every_part_is_in_the_installed_mlx_lm():
    seam.check()


def test_an_engine_refuses_to_start_when_mlx_lm_lacks_one_part(tmp_path):
    """A real engine start, ``_make_logits_processors`` hidden from mlx_lm.server before it runs
    (a ``sitecustomize`` on its path): it exits at once, one line naming the part."""
    (tmp_path / "sitecustomize.py").write_text("import mlx_lm.server\ndel mlx_lm.server._make_logits_processors\n")
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    from localchat.demo_codes import MODEL_DIR

    done = subprocess.run([sys.executable, "-m", "localchat.serve.engine.enforcing", "--model", str(MODEL_DIR),
                           "--port", "1"], capture_output=True, text=True, timeout=120, env=env)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and lines[-1].startswith("localchat serve: the engine needs"), done.stderr
    assert "mlx_lm.server._make_logits_processors(args)" in lines[-1] and "Traceback" not in done.stderr
    assert Path(tmp_path / "sitecustomize.py").exists()
