"""``localchat ps --base-url`` against a server that answers anything: rows of the wrong types,
times past any clock, JSON nested 100,000 deep, NaN and Infinity, 120,000 rows, a body past any
serve's: each one line and exit 1, within seconds, never a traceback; ``--json`` prints only JSON;
at 60 columns (or piped) a long name is wrapped, never cut, and a model that loads says so."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from fakeserver import FakeServer, Reply
from localchat.cli.app import app

GOOD_ROW = {"model": "demo-tools-with-a-rather-long-name-for-sixty-columns", "state": "loaded",
            "memory_bytes": 33_300_000, "resident_bytes": 120_000_000, "loaded_at": 1_765_000_000.0,
            "expires_in_s": 290.0, "in_flight": 0, "waiting": 0, "pid": 4242, "pinned": False}


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.close()


@dataclass
class Shown:
    returncode: int
    stdout: str
    stderr: str


def ps(fake: FakeServer, body: bytes | str, *args: str, columns: int = 200) -> Shown:
    """``localchat ps`` in this process (as a pipe shows it, ``columns`` wide)."""
    fake.replies["/localchat/ps"] = Reply(chunks=[body.encode() if isinstance(body, str) else body],
                                          headers={"Content-Type": "application/json"})
    result = CliRunner().invoke(app, ["ps", "--base-url", fake.base_url, *args], env={"COLUMNS": str(columns)})
    return Shown(result.exit_code, result.stdout, result.stderr)


def rows(*changed: dict) -> str:
    return json.dumps({"models": [GOOD_ROW | change for change in changed], "served": ["demo-tools"]})


@pytest.mark.parametrize("body", [
    rows({"memory_bytes": "big"}), rows({"expires_in_s": [1]}), rows({"in_flight": None}), rows({"model": 5}),
    rows({"loaded_at": -1}), '{"models": [{"model": "x", "state": "loaded", "loaded_at": -1e400}]}',
    '{"models": [{"model": "x", "state": "loaded", "expires_in_s": NaN}]}',
    '{"models": [{"model": "x", "state": "loaded", "memory_bytes": Infinity}]}',
    '{"models": ' + "[" * 100_000 + "]" * 100_000 + "}",
    json.dumps({"models": [GOOD_ROW] * 120_000}), b"{" + b" " * (5 * 1024**2) + b"}", rows({"pinned": "yes"}),
], ids=["size-str", "expiry-list", "in-flight-null", "model-int", "negative-time", "time-overflow", "nan", "infinity",
        "deep", "rows-120k", "huge-body", "pinned-str"])
def test_what_is_not_what_serve_sends_is_one_line(fake, body):
    started = time.monotonic()
    for args in ((), ("--json",)):
        done = ps(fake, body, *args)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert len([line for line in done.stderr.splitlines() if line.strip()]) == 1 and done.stdout == ""
    assert time.monotonic() - started < 30


def test_json_is_json_and_a_long_name_is_never_cut_at_sixty_columns(fake):
    loading = GOOD_ROW | {"model": "smollm2", "state": "loading", "expires_in_s": None, "waiting": 2, "pid": None}
    body = json.dumps({"models": [GOOD_ROW, loading], "served": ["a"]})
    as_json = ps(fake, body, "--json")
    assert as_json.returncode == 0 and [row["model"] for row in json.loads(as_json.stdout)] == [
        GOOD_ROW["model"], "smollm2"]
    for columns in (60, 100, 200):
        shown = ps(fake, body, columns=columns)
        assert shown.returncode == 0, shown.stderr
        assert GOOD_ROW["model"] in "".join(shown.stdout.split()), shown.stdout  # wrapped, every character there
        assert "loading" in shown.stdout and "2 waiting" in shown.stdout
        assert all(len(line) <= columns for line in shown.stdout.splitlines())


def test_a_model_served_by_another_server_is_named_with_its_address_and_odd_ones_are_left_out(fake):
    body = json.dumps({"models": [], "served": ["demo", "far"], "upstreams": {
        "demo": "http://127.0.0.1:24001/v1", "far": 7, "x" * 10_000: "http://elsewhere/v1"}})
    shown = ps(fake, body, columns=60)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "no model loaded (serving demo, far)" in text
    assert "demo: served by http://127.0.0.1:24001/v1 (not loaded or unloaded here)" in text
    assert "far:" not in text and len(shown.stdout) < 2_000  # (not an address; a name cut at 500 characters)
    assert ps(fake, json.dumps({"models": [], "served": [], "upstreams": ["x"]})).returncode == 0
