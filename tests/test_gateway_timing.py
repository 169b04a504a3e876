"""The gateway's figures and pace: each delta reaches the client when the server sent it, and the
figures it logs are ones its clock can honestly give (a burst has no decode speed)."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from fakeserver import FakeServer, Reply, delta, sse
from gateways import gateway_for

TOKENS = 9
USAGE = {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": TOKENS}}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
MESSAGES = {"model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
RESPONSES = {"model": "m", "input": "Hi", "stream": True}
REQUESTS = {
    "anthropic": ("/v1/messages", MESSAGES, '"text_delta"'),
    "anthropic with tools": ("/v1/messages", {**MESSAGES, "tools": [{"name": "add", "input_schema": ADD}]},
                             '"text_delta"'),
    "responses": ("/v1/responses", RESPONSES, "response.output_text.delta"),
    "responses with tools": ("/v1/responses", {**RESPONSES, "tools": [{"type": "function", "name": "add",
                                                                        "parameters": ADD}]},
                             "response.output_text.delta"),
}


def words() -> list[dict]:
    return [delta(f"w{i} ") for i in range(TOKENS - 1)] + [delta("end", "stop"), USAGE]


def delta_times(url: str, body: dict, marker: str) -> list[float]:
    stamps = []
    with httpx.stream("POST", url, json=body, timeout=30) as reply:
        for line in reply.iter_lines():
            if line.startswith("data:") and marker in line:
                stamps.append(time.monotonic())
    return stamps


def logged_speed(logs: list[str], path: str) -> str | None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        line = next((entry for entry in logs if entry.startswith(f"POST {path} 200")), None)
        if line is not None:
            found = re.search(r"([\d.]+) tok/s", line)
            return found[1] if found else ""
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("case", list(REQUESTS))
def test_a_slow_upstream_s_tokens_reach_the_client_spread_as_it_sent_them(case):
    path, body, marker = REQUESTS[case]
    fake = FakeServer()
    fake.chat(Reply(chunks=sse(*words()), pause_s=0.05))  # one token every 50 ms
    try:
        with gateway_for(fake.base_url, ready=False) as gw:
            stamps = delta_times(gw.url + path, body, marker)
            speed = logged_speed(gw.logs, path)
    finally:
        fake.close()
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert len(stamps) == TOKENS, stamps
    assert min(gaps) > 0.02 and stamps[-1] - stamps[0] > 0.3, gaps  # never two deltas held and sent together
    assert speed and 12 < float(speed) < 30, gw.logs  # ~20 tok/s, as the server sent them


@pytest.mark.parametrize("case", ["anthropic", "responses"])
def test_a_reply_that_arrives_in_one_burst_logs_no_decode_speed(case):
    path, body, marker = REQUESTS[case]
    fake = FakeServer()
    fake.chat(Reply(chunks=[b"".join(sse(*words()))], pause_s=0.05))  # every token in one write
    try:
        with gateway_for(fake.base_url, ready=False) as gw:
            assert len(delta_times(gw.url + path, body, marker)) == TOKENS
            speed = logged_speed(gw.logs, path)
    finally:
        fake.close()
    assert speed == "", gw.logs  # the line is there, without a figure the clock never saw
