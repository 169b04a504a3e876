"""Files and streams that never end or never arrive: a FIFO with no writer, ``/dev/zero``, a
directory, a file past the limit, standard input without a line break, bytes that are not UTF-8.

Each named file is one ``error:`` line and exit 2 within seconds (never a hang, never memory
filled); a REPL fed an endless line keeps the turns it already took.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from localchat.files import read_regular, read_text

TIMEOUT_S = 60  # a process's start here is 1–3 s; a hang is forever


def within(seconds: float, call):
    """``call()``'s result or exception, or an AssertionError once it has blocked ``seconds``."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 (handed back to the test)
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still blocked after {seconds}s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return path


def test_a_fifo_a_device_and_a_directory_are_refused_without_blocking(fifo, tmp_path):
    for path, why in [(fifo, "a pipe or a device"), (Path("/dev/zero"), "a pipe or a device"),
                      (tmp_path, "a directory")]:
        with pytest.raises(OSError) as caught:
            within(5, lambda path=path: read_regular(path))
        assert caught.value.strerror.startswith(why)


def test_a_file_past_the_limit_is_refused_and_one_at_it_is_read(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b"x" * 1001)
    with pytest.raises(OSError) as caught:
        read_text(path, limit=1000)
    assert caught.value.errno == errno.EFBIG and "1,000" in caught.value.strerror
    assert read_regular(path, limit=1000) == b"x" * 1001  # (one byte over says it is longer)
    path.write_bytes("é".encode() * 500)
    assert read_text(path, limit=1000) == "é" * 500
    path.write_bytes(b"\xff")
    with pytest.raises(UnicodeDecodeError):
        read_text(path)
    path.write_bytes(b"\xef\xbb\xbf{}")  # a byte-order mark, as Windows editors write: not part of the text
    assert read_text(path) == "{}"


def localchat(*args: str, home: Path, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localchat", *args], stdin=stdin, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, "LOCALCHAT_HOME": str(home)})


def one_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert all(needle in errors[0] for needle in needles), errors[0]


@pytest.mark.parametrize("command", [
    ["chat", "-m", "demo", "--json-schema", "{path}", "hi"],
    ["chat", "-m", "demo", "--mcp", "{path}", "hi"],
    ["serve", "--hostfile", "{path}"],
    ["bench", "-m", "demo", "--script", "{path}"],
    ["load", "--script", "{path}"],
])
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_every_settings_file_that_is_a_fifo_or_a_device_is_one_line(command, kind, fifo, tmp_path):
    path = str(fifo) if kind == "fifo" else "/dev/zero"
    done = localchat(*[part.format(path=path) for part in command], home=tmp_path / "home")
    one_error(done, path, "a pipe or a device, not a file")


def test_a_server_log_that_is_a_fifo_is_refused_before_anything_starts(fifo):
    from localchat.server.launch import ServerStartError, open_log

    with pytest.raises(ServerStartError, match="a pipe, not a file"):
        within(5, lambda: open_log(fifo))
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # someone reading it: still no log of ours
    try:
        with pytest.raises(ServerStartError, match="a pipe or a device, not a file"):
            within(5, lambda: open_log(fifo))
    finally:
        os.close(reader)


def test_a_repl_fed_an_endless_line_stops_in_one_line_and_keeps_what_it_answered(tmp_path):
    home = tmp_path / "home"
    with (tmp_path / "stdin").open("wb") as feed:
        feed.write(b"my code is 42\n" + b"\0" * (17 * 1024**2))
    with (tmp_path / "stdin").open("rb") as feed:
        done = localchat("chat", "-m", "demo", home=home, stdin=feed)
    one_error(done, "standard input", "stopped reading")
    assert done.stderr.count("[TTFT") == 1  # the first line was answered, then the endless one refused
    row = next(line for line in localchat("log", home=home).stdout.splitlines() if "my code is 42" in line)
    assert [cell.strip() for cell in row.split("│")][3:5] == ["demo", "1"]  # kept: the model, one turn


def test_a_prompt_from_an_endless_standard_input_is_refused_unread(tmp_path):
    with open("/dev/zero", "rb") as zero:
        done = localchat("chat", "-m", "demo", "--no-log", "-", home=tmp_path / "home", stdin=zero)
    one_error(done, "standard input is over 8000 characters")


def test_bytes_that_are_not_utf8_are_refused_where_they_come_in(tmp_path):
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, "-m", "localchat", "chat", "-m", "demo", "--no-log"], capture_output=True,
                          input=b"\xff\xfe\nhi\n", timeout=TIMEOUT_S, env={**os.environ, "LOCALCHAT_HOME": str(home)})
    err = done.stderr.decode()
    assert done.returncode == 0 and err.count("error:") == 1 and "not UTF-8 text" in err, err
    assert err.count("[TTFT") == 1  # the next line was answered
    for flag in ("--system", "--pin", "--choice", "--regex"):
        argv = [sys.executable.encode(), b"-m", b"localchat", b"chat", b"-m", b"demo", b"--no-log",
                flag.encode(), b"a\xff,b", b"hi"]
        done = subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S,
                              env={**os.environ, "LOCALCHAT_HOME": str(home)})
        err = done.stderr.decode()
        assert done.returncode == 2 and flag in err and "not UTF-8 text" in err and "Traceback" not in err, err


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_records_directory_that_is_a_file_is_refused_before_the_model_loads(kind, fifo, tmp_path):
    target = fifo if kind == "fifo" else tmp_path / "notes.txt"
    if kind == "file":
        target.write_text("precious")
    done = localchat("chat", "-m", "demo", "--no-log", "--record", str(target), "hi", home=tmp_path / "home")
    one_error(done, f"--record {target} is a file, not a directory")
    assert "loaded demo" not in done.stderr and (kind == "fifo" or target.read_text() == "precious")
