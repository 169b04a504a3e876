"""Pictures in the conversation: the bundled ``demo-vision`` toy through mlx-vlm in this process,
through a real ``mlx_vlm.server``, and through the gateway with the official SDKs; pictures kept
with their turn (trimmed, logged, searched, saved, resumed, exported, recorded); hostile pictures,
a text-only model and a missing extra, each one line and exit 2 before any model loads."""

from __future__ import annotations

import base64
import io
import json
import os
import random
import sqlite3
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from PIL import Image

from demo.pictures import SHAPES, draw
from in_process import run_cli
from localchat.conversation.history import Conversation, Turn
from localchat.store.saved_sessions import DB_NAME
from localchat.vision.image import picture_from_bytes

ROOT = Path(__file__).resolve().parents[1]
RED_CIRCLE = ROOT / "examples" / "images" / "red-circle.png"
WHAT = "What is in the picture?"


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def picture_file(tmp_path: Path, colour: str, shape: str, name: str, size=(220, 180)) -> Path:
    path = tmp_path / name
    picture = draw(colour, shape, *size, random.Random(7), background=(255, 255, 255), scale=(0.6, 0.6))
    path.write_bytes(png(picture.image))
    return path


def localchat(home: Path, *args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI a user runs, in its own process (marked as this run's: see ``owned``), with a home of the test's own."""
    environment = dict(os.environ) | {"LOCALCHAT_HOME": str(home), "HF_HUB_OFFLINE": "1"} | (env or {})
    return subprocess.run([sys.executable, "-m", "localchat", *args], input=stdin, capture_output=True, text=True,
                          timeout=180, env=environment, cwd=ROOT)


def answers(stdout: str) -> list[str]:
    """A piped REPL's answers, without its prompts."""
    lines = (line.replace(">>> ", "").strip() for line in stdout.replace(">>> ", "\n").splitlines())
    return [line for line in lines if line and line != ">>>"]


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


# --- in-process: mlx-vlm in this process ---------------------------------------------------------

def named(answer: str, colour: str, shape: str | None = None) -> bool:
    """The toy's answer to "What is in the picture?": the picture's colour and a shape, that shape
    when one is given. It names the colour of nearly every picture and the shape of about two in
    three (its card), so the shape is asked of the bundled red circle, and of held-out pictures as a
    rate (tests/training/test_vision_circuit.py)."""
    words = answer.split()
    return len(words) == 3 and words[:2] == ["a", colour] and words[2] in ((shape,) if shape else SHAPES)


def test_the_done_when_command_answers_from_the_picture(tmp_path):
    done = localchat(tmp_path, "chat", "-m", "demo-vision", "--image", str(RED_CIRCLE), WHAT)
    assert done.returncode == 0, done.stderr
    assert named(done.stdout.strip(), "red", "circle"), done.stdout
    assert "[image: red-circle.png, 200×160, 19 tokens]" in done.stderr


def test_the_answer_changes_with_the_picture(tmp_path):
    """The toy really looks: another picture, another colour named (not a memorized reply)."""
    for colour, shape in (("blue", "square"), ("yellow", "triangle"), ("green", "circle")):
        path = picture_file(tmp_path, colour, shape, f"{colour}.png")
        done = run_cli(tmp_path, "chat", "-m", "demo-vision", "--image", str(path), WHAT, "--no-log")
        assert named(done.stdout.strip(), colour), done.stderr


def test_a_picture_read_from_stdin(tmp_path):
    done = subprocess.run([sys.executable, "-m", "localchat", "chat", "-m", "demo-vision", "--image", "-", WHAT,
                           "--no-log"], input=RED_CIRCLE.read_bytes(), capture_output=True, timeout=180,
                          env=dict(os.environ) | {"LOCALCHAT_HOME": str(tmp_path)})
    assert named(done.stdout.decode().strip(), "red", "circle"), done.stderr.decode()


def test_the_repl_attaches_with_slash_image_and_recalls_it_turns_later(tmp_path):
    """``/image`` shows the picture's size and tokens first; later turns ask about it without it."""
    script = "\n".join([f"/image {RED_CIRCLE}", WHAT, "What colour was it?", "What shape was it?", "/history",
                        "/save pictured"]) + "\n"
    done = run_cli(tmp_path, "chat", "-m", "demo-vision", stdin=script)
    assert done.returncode == 0, done.stderr
    assert "attached [image: red-circle.png, 200×160, 19 tokens]" in done.stderr
    said = answers(done.stdout)
    assert len(said) == 3 and named(said[0], "red", "circle") and said[1] == "red" and said[2] == "circle", said
    assert "user: [image: red-circle.png, 200×160, 19 tokens]" in done.stderr  # /history: a label, not bytes
    assert "base64" not in done.stderr + done.stdout
    assert "(cached" in done.stderr  # the turns after the picture reuse its prefix (mlx-vlm's prompt cache)

    resumed = run_cli(tmp_path, "chat", "--resume", "pictured", stdin="What was in the picture?\n")
    assert len(answers(resumed.stdout)) == 1 and named(answers(resumed.stdout)[0], "red", "circle"), resumed.stderr

    log = run_cli(tmp_path, "log", "show", "pictured")
    assert "user: [image: red-circle.png, 200×160, 19 tokens]" in log.stdout
    found = run_cli(tmp_path, "log", "-q", '"red-circle.png"')
    assert "**red-circle.png**" in found.stdout and "What is in the" in found.stdout  # the text around it
    found = run_cli(tmp_path, "log", "-q", "picture")
    assert "What is in the **picture**" in found.stdout

    exported = json.loads(run_cli(tmp_path, "sessions", "export", "pictured", "--format", "json").stdout)
    parts = exported["messages"][1]["content"]
    assert parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1]) == RED_CIRCLE.read_bytes()
    markdown = run_cli(tmp_path, "sessions", "export", "pictured", "--format", "md").stdout
    assert "![red-circle.png](data:image/png;base64," in markdown

    with sqlite3.connect(tmp_path / DB_NAME) as db:  # the bytes once, however many rows refer to them
        assert db.execute("SELECT COUNT(*) FROM images").fetchone()[0] == 1
        assert db.execute("SELECT COUNT(*) FROM log WHERE images IS NOT NULL").fetchone()[0] == 1
        assert all("base64" not in (row[0] or "") for row in db.execute("SELECT images FROM log"))


def test_a_new_picture_after_reset_is_seen_not_the_cached_one(tmp_path):
    """mlx-vlm matches its cached prefix by token ids, and two pictures of one size are the same
    ids: after /reset the next picture must be looked at, not the old one's cached keys reused."""
    first = picture_file(tmp_path, "red", "circle", "first.png")
    second = picture_file(tmp_path, "blue", "square", "second.png")
    script = f"/image {first}\n{WHAT}\n/reset\n/image {second}\n{WHAT}\n"
    done = run_cli(tmp_path, "chat", "-m", "demo-vision", "--no-log", stdin=script)
    said = answers(done.stdout)
    assert len(said) == 2 and named(said[0], "red") and named(said[1], "blue"), done.stderr


def test_records_keep_each_picture_once_beside_them(tmp_path):
    records = tmp_path / "records"
    done = run_cli(tmp_path, "chat", "-m", "demo-vision", "--record", str(records), "--no-log",
                     stdin=f"/image {RED_CIRCLE}\n{WHAT}\nWhat colour was it?\n")
    assert done.returncode == 0, done.stderr
    pictures = list((records / "images").iterdir())
    assert len(pictures) == 1 and pictures[0].read_bytes() == RED_CIRCLE.read_bytes()
    requests = sorted(records.glob("*-request.json"))
    assert len(requests) == 2
    for request in requests:
        text = request.read_text()
        assert "base64" not in text and f"images/{pictures[0].name}" in text


# --- history: a picture belongs to its turn ------------------------------------------------------------

@pytest.fixture(scope="module")
def a_picture():
    return picture_from_bytes(RED_CIRCLE.read_bytes(), "red-circle.png")


def test_trimming_drops_a_picture_with_its_turn_never_alone(a_picture):
    conversation = Conversation("sys", [Turn("look", "a red circle", images=(a_picture,)), Turn("hi", "hello"),
                                        Turn("and?", "fine")])

    def parts(messages):
        return [p for m in messages if isinstance(m["content"], list) for p in m["content"]]

    assert len([p for p in parts(conversation.preview("q")) if p["type"] == "image_url"]) == 1
    by_turns = conversation.plan_trim("q", max_turns=2)
    assert by_turns == 1 and parts(conversation.preview("q", drop=by_turns)) == []

    def count(messages):  # a picture costs what its processor says (19 tokens for the toy)
        contents = [m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
                    for m in messages]
        return sum(19 if p["type"] == "image_url" else len(p["text"]) for content in contents for p in content)

    by_tokens = conversation.plan_trim("q", max_tokens=count(conversation.preview("q")) - 1, count_tokens=count)
    assert by_tokens == 1 and parts(conversation.preview("q", drop=by_tokens)) == []
    conversation.compact("Note: the picture showed a red circle.", keep=1)
    assert parts(conversation.preview("q")) == [] and len(conversation.turns) == 1


class SeeingBackend:
    """A backend that answers "ok" and keeps the messages of each call: what a retry sends."""

    name, model_id, template = "fake", "fake", None

    def __init__(self):
        self.calls = []

    def stream(self, messages, params):
        from localchat.backends import Finished, TextChunk

        self.calls.append(messages)
        yield TextChunk("ok")
        yield Finished(finish_reason="stop", prompt_tokens=1, completion_tokens=1)

    def count_tokens(self, messages, think=None):
        return None

    def context_length(self):
        return None

    def close(self):
        pass


def test_a_retry_sends_its_picture_again_and_keeps_the_one_attached_for_the_next_question(a_picture):
    from dataclasses import replace

    from localchat.backends import GenerationParams
    from localchat.conversation.turn import ChatSession

    backend = SeeingBackend()
    session = ChatSession(backend, Conversation(None), GenerationParams())
    session.conversation.attached = (a_picture,)
    assert session.ask(WHAT).committed
    pending = replace(a_picture, ref=replace(a_picture.ref, name="b.webp"))
    session.conversation.attached = (pending,)  # /image b.webp, then /retry
    assert session.retry().committed
    sent = backend.calls[-1][-1]["content"]
    assert [p["type"] for p in sent] == ["image_url", "text"]  # the retried question's own picture
    assert session.conversation.attached == (pending,)  # b is still waiting for the next question
    assert len(session.conversation.turns) == 1 and session.conversation.turns[0].images == (a_picture,)
    session.ask("and now?")
    assert session.conversation.turns[-1].images == (pending,) and session.conversation.attached == ()


# --- refusals: one line, exit 2, before any model loads, nothing kept ---------------------------------

def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_header(width: int, height: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


def _bomb(side: int) -> bytes:
    """A PNG of ``side`` × ``side`` black pixels: a few hundred kilobytes that decode to gigabytes."""
    squeeze = zlib.compressobj(9)
    row = b"\x00" * (1 + 3 * side)
    body = b"".join(squeeze.compress(row) for _ in range(side)) + squeeze.flush()
    return _png_header(side, side) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def hostile_pictures(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = png(Image.new("RGB", (64, 64), "red"))
    noisy = Image.frombytes("RGB", (200, 160), random.Random(1).randbytes(200 * 160 * 3))
    with_exif = _png_header(8, 8) + _chunk(b"eXIf", b"MM\x00*" + b"\x00" * (4 * 1024**2)) + \
        png(Image.new("RGB", (8, 8)))[33:]
    cases = {
        "not an image": (b"these are words, not pixels\n" * 20, "is not a picture"),
        "truncated": (png(noisy)[:4000], "damaged or truncated"),
        "20000 x 20000": (_png_header(20000, 20000) + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b""),
                          "more pixels than any picture"),
        "a zip bomb": (_bomb(8000), "8000×8000 pixels"),
        "a huge EXIF block": (with_exif, "bytes of metadata"),
        "an SVG": (b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"><circle r="4"/></svg>',
                   "is an SVG drawing"),
        "empty": (b"", "is empty"),
    }
    out = {}
    for i, (name, (data, said)) in enumerate(cases.items()):
        path = tmp_path / f"hostile-{i}.png"
        path.write_bytes(data)
        out[name] = (path, said)
    assert picture_from_bytes(good, "good.png").ref.width == 64  # the corpus's good twin is taken
    return out


def test_hostile_pictures_are_one_line_each_and_nothing_is_kept(tmp_path):
    for case, (path, said) in hostile_pictures(tmp_path).items():
        done = run_cli(tmp_path, "chat", "-m", "demo-vision", "--image", str(path), WHAT)
        assert done.returncode == 2, (case, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and said in done.stderr, (case, done.stderr)
        assert "loaded" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / DB_NAME).exists()  # nothing was kept, not even an empty conversation


def test_a_hostile_picture_in_the_repl_is_one_line_and_the_repl_goes_on(tmp_path):
    corpus = hostile_pictures(tmp_path)
    script = "".join(f"/image {path}\n" for path, _ in corpus.values()) + f"/image {RED_CIRCLE}\n{WHAT}\n"
    done = run_cli(tmp_path, "chat", "-m", "demo-vision", "--no-log", stdin=script)
    assert done.returncode == 0 and len(errors(done)) == len(corpus), done.stderr
    assert len(answers(done.stdout)) == 1 and named(answers(done.stdout)[0], "red", "circle")


def test_a_text_only_model_given_a_picture_names_a_vision_model(tmp_path):
    done = run_cli(tmp_path, "chat", "-m", "demo", "--image", str(RED_CIRCLE), WHAT)
    assert done.returncode == 2
    assert errors(done) == ["error: demo is a text-only model: it cannot see pictures; use a vision model "
                            "(e.g. -m demo-vision, or -m qwen2.5-vl-3b on a Mac)"]
    assert "loaded" not in done.stderr
    repl = run_cli(tmp_path, "chat", "-m", "demo", "--no-log", stdin=f"/image {RED_CIRCLE}\nhi\n")
    assert "demo is a text-only model" in repl.stderr and repl.returncode == 0


def test_without_the_extra_a_picture_is_one_line_naming_the_command(tmp_path):
    """mlx-vlm made unimportable (as on a machine without ``--extra vision``)."""
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoVision:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'mlx_vlm' or name.startswith('mlx_vlm.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, NoVision())\n")
    env = {"PYTHONPATH": str(blocker)}
    for args in (("chat", "--image", str(RED_CIRCLE), WHAT), ("chat", "-m", "demo-vision", WHAT),
                 ("serve", "-m", "demo-vision", "--dry-run")):
        done = localchat(tmp_path, *args, env=env)
        assert done.returncode == 2, done.stderr
        assert len(errors(done)) == 1 and "uv run --extra vision" in done.stderr, done.stderr
    assert localchat(tmp_path, "chat", "hi", "--no-log", env=env).returncode == 0  # text models need none of it


# --- over HTTP: a real mlx_vlm.server, and the gateway in front of it -------------------------------------

@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    from localchat.registry import resolve
    from localchat.server.launch import free_port, launch, wait_ready

    server = launch(resolve("demo-vision").location, port=free_port(),
                    log_path=tmp_path_factory.mktemp("vlm") / "server.log", vision=True)
    try:
        wait_ready(server, timeout_s=120)
        yield server
    finally:
        server.stop()


def test_the_toy_answers_through_mlx_vlm_server_as_in_process(vision_server, tmp_path):
    script = f"/image {RED_CIRCLE}\n{WHAT}\nWhat colour was it?\n"
    served = localchat(tmp_path, "chat", "--backend", "server", "--base-url", vision_server.base_url,
                       "-m", "demo-vision", "--no-log", stdin=script)
    local = localchat(tmp_path, "chat", "-m", "demo-vision", "--no-log", stdin=script)
    assert served.returncode == 0, served.stderr
    assert answers(served.stdout) == answers(local.stdout) and answers(served.stdout)[1] == "red"
    assert named(answers(served.stdout)[0], "red", "circle")
    assert "in 54 ·" in served.stderr and "in 54 ·" in local.stderr  # the same prompt, token for token


def test_the_gateway_maps_anthropic_image_blocks_and_responses_input_images(vision_server):
    import anthropic

    from gateways import gateway_for
    from localchat.registry import resolve

    data = base64.b64encode(RED_CIRCLE.read_bytes()).decode()
    with gateway_for(vision_server.base_url, "demo-vision") as gateway:
        claude = anthropic.Anthropic(base_url=gateway.url, api_key="none", max_retries=0)
        message = claude.messages.create(
            model=resolve("demo-vision").location, max_tokens=16, system="You are a helpful assistant.",
            messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
                {"type": "text", "text": WHAT}]}], extra_body={"temperature": 0.0})
        assert named(message.content[0].text.strip(), "red", "circle")

        from servers import openai_client

        codex = openai_client(gateway.url + "/v1")
        response = codex.responses.create(
            model=resolve("demo-vision").location, instructions="You are a helpful assistant.", temperature=0.0,
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": f"data:image/png;base64,{data}"},
                                                 {"type": "input_text", "text": WHAT}]}])
        assert named(response.output_text.strip(), "red", "circle")

        refused = gateway.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}]}]})
        assert refused.status_code == 400 and "base64" in refused.json()["error"]["message"]


def test_serve_smoke_and_parity_hold_for_the_vision_toy(tmp_path):
    """serve --smoke shows it a red circle (required); parity plays three turns about one picture
    in this process and through mlx_vlm.server: the same prompts and the same answers."""
    smoke = localchat(tmp_path, "serve", "-m", "demo-vision", "--port", str(_free_port()), "--smoke")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "a picture answered" in smoke.stdout and "answered 'a red circle'" in smoke.stdout
    parity = localchat(tmp_path, "parity", "-m", "demo-vision", "--json")
    report = json.loads(parity.stdout)
    assert parity.returncode == 0 and report["first_difference"] is None, parity.stdout + parity.stderr
    said = [t["inproc_text"] for t in report["turns"]]
    assert named(said[0], "red") and said[1] == "red" and said[2] in SHAPES


def _free_port() -> int:
    from localchat.server.launch import free_port

    return free_port()


def test_serve_launches_mlx_vlm_server_for_a_vision_model(tmp_path):
    done = localchat(tmp_path, "serve", "-m", "demo-vision", "--dry-run")
    assert done.returncode == 0 and "-m mlx_vlm.server --model" in done.stdout
    done = localchat(tmp_path, "serve", "-m", "demo-vision", "--ranks", "2", "--dry-run")
    assert done.returncode == 2 and "vision model" in done.stderr


def test_the_bundled_example_picture_is_what_the_docs_say():
    with Image.open(RED_CIRCLE) as image:
        assert image.size == (200, 160) and image.getpixel((100, 80))[:3] == (220, 30, 30)
    assert os.path.getsize(RED_CIRCLE) < 10_000
