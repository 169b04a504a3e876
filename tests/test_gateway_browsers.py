"""The gateway from a browser: a web page the user visits cannot drive the local model (foreign
Origin, foreign Host: DNS rebinding), allowed pages get CORS, and connections whose headers never
finish are closed."""

from __future__ import annotations

import socket
import time

import pytest

from fakeserver import GOOD, FakeServer, Reply
from gateways import gateway_for
from localchat.serve.front import guards as browsers

BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def fake():
    server = FakeServer()
    server.chat(Reply(chunks=GOOD))
    yield server
    server.close()


def test_a_cross_site_page_and_a_rebound_host_are_refused_before_anything_reaches_the_server(fake):
    with gateway_for(fake.base_url, ready=False) as gw:
        port = gw.url.rsplit(":", 1)[1]
        cross = gw.post("/v1/messages", content=b'{"model": "m", "max_tokens": 8, "messages": '
                                                b'[{"role": "user", "content": "Hi"}]}',
                        headers={"content-type": "text/plain", "origin": "https://evil.example"})
        rebound = gw.post("/v1/messages", json=BODY, headers={"host": f"attacker.example:{port}"})
    assert cross.status_code == 403 and "--allow-origin https://evil.example" in cross.json()["error"]["message"]
    assert rebound.status_code == 403 and "attacker.example" in rebound.json()["error"]["message"]
    assert fake.requests == []  # neither reached the model
    assert any("403" in line and "evil.example" in line for line in gw.logs)


def test_this_machine_s_pages_and_allowed_origins_get_cors_and_a_preflight(fake):
    with gateway_for(fake.base_url, ready=False) as gw:
        local = gw.post("/v1/messages", json=BODY, headers={"origin": "http://localhost:3000"})
        preflight = gw.options("/v1/messages", headers={"origin": "http://127.0.0.1:5173",
                                                        "access-control-request-method": "POST"})
        plain = gw.post("/v1/messages", json=BODY)  # an SDK: no Origin at all
    assert local.status_code == 200 and local.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert preflight.status_code == 204 and "x-api-key" in preflight.headers["access-control-allow-headers"]
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_allow_origin_lets_a_named_page_in():
    policy = browsers.BrowserPolicy(host="127.0.0.1", port=8081, origins=("https://app.example",))
    assert policy.origin_allowed("https://app.example") and not policy.origin_allowed("https://other.example")
    assert browsers.BrowserPolicy(host="127.0.0.1", port=1, origins=("*",)).origin_allowed("https://any.example")
    assert policy.host_allowed("localhost:8081") and policy.host_allowed("[::1]:8081")
    assert not policy.host_allowed("127.0.0.1.evil.example:8081") and policy.host_allowed("")
    assert browsers.BrowserPolicy(host="0.0.0.0", port=1).host_allowed("my-mac.local:1")  # (its key guards it)


def test_a_gateway_that_is_not_running_fails_a_test_with_a_clear_message(fake):
    with gateway_for(fake.base_url, ready=False) as gw:
        gw.running.stop()
        with pytest.raises(pytest.fail.Exception, match="the gateway is not running: nothing listens at"):
            gw.post("/v1/messages", json=BODY)


def test_a_connection_whose_headers_never_finish_is_closed(fake, monkeypatch):
    monkeypatch.setattr(browsers, "HEADERS_S", 1.0)
    with gateway_for(fake.base_url, ready=False) as gw:
        host, port = gw.url.removeprefix("http://").rsplit(":", 1)
        sockets = [socket.create_connection((host, int(port))) for _ in range(5)]
        for sock in sockets:
            sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            sock.settimeout(5)
        started = time.monotonic()
        closed = [sock.recv(100) == b"" for sock in sockets]  # the server closes: recv returns b""
        for sock in sockets:
            sock.close()
        assert all(closed) and time.monotonic() - started < 4
        assert gw.post("/v1/messages", json=BODY).status_code == 200  # and goes on serving
