"""How the relay reads an HTTP/1.1 upstream's body (another localchat front, any server behind
``gateway --upstream``): chunks and lengths split anywhere, read to their end, garbage refused."""

from __future__ import annotations

import asyncio
import time

import pytest

from localchat.serve.apis.chat_completions.body_framing import Chunked, Counted, FramingError, framing_for
from localchat.serve.apis.chat_completions.byte_relay import Address, UpstreamReply

EVENTS = [b'data: {"n": 1}\n\n', b"", b"data: " + "é…".encode() * 40 + b"\n\n", b"data: [DONE]\n\n"]


def chunked(pieces: list[bytes], trailer: bytes = b"") -> bytes:
    framed = b"".join(b"%x;ext=1\r\n%b\r\n" % (len(p), p) for p in pieces if p)
    return framed + b"0\r\n" + trailer + b"\r\n"


def read_in_pieces(framing, body: bytes, size: int) -> bytes:
    out = b""
    for at in range(0, len(body), size):
        out += framing.payload(body[at:at + size])
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 4096])
def test_a_chunked_body_split_anywhere_gives_its_payload_and_ends_after_the_trailer(size):
    body = chunked(EVENTS, trailer=b"X-Checksum: 1\r\n")
    framing = Chunked()
    assert read_in_pieces(framing, body[:-1], size) == b"".join(EVENTS) and not framing.done  # the last LF to come
    assert framing.payload(body[-1:] + b"HTTP/1.1 200 next") == b"" and framing.done  # nothing after it is this body's


def test_a_chunked_body_with_garbage_is_refused():
    with pytest.raises(FramingError, match="not hex"):
        Chunked().payload(b"zz\r\nhello\r\n")
    with pytest.raises(FramingError, match="CRLF"):
        Chunked().payload(b"2\r\nhiXX")
    with pytest.raises(FramingError, match="no end"):
        Chunked().payload(b"1" * 5000)
    with pytest.raises(FramingError, match="negative"):
        Chunked().payload(b"-5\r\n")


def test_a_counted_body_ends_at_its_length():
    framing = Counted(left=5)
    assert framing.payload(b"abc") == b"abc" and not framing.done
    assert framing.payload(b"deXYZ") == b"de" and framing.done
    assert Counted(left=0).payload(b"x") == b""


def test_the_framing_is_read_from_the_head():
    assert framing_for(200, {}, "POST") is None  # HTTP/1.0, our engines: the close ends it
    assert isinstance(framing_for(200, {"transfer-encoding": "chunked"}, "POST"), Chunked)
    assert framing_for(200, {"content-length": "12"}, "POST") == Counted(left=12)
    assert framing_for(204, {}, "POST").done and framing_for(200, {"content-length": "9"}, "HEAD").done
    with pytest.raises(FramingError, match="not a number"):
        framing_for(200, {"content-length": "-1"}, "POST")


def test_an_upstreams_address_keeps_its_path_port_and_tls():
    assert Address.of("http://127.0.0.1:8081/v1") == Address("127.0.0.1", 8081, False, "127.0.0.1:8081", "")
    assert Address.of("https://user:pw@example.org/llm/v1") == Address("example.org", 443, True, "example.org",
                                                                        "/llm")
    assert Address.of("http://[::1]:9/v1").host == "::1"


class Socket:
    def __init__(self):
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_framed_reply_ends_when_its_body_does_though_the_server_keeps_the_connection():
    async def relayed() -> bytes:
        reply, socket = UpstreamReply(b""), Socket()
        reply.connection_made(socket)  # type: ignore[arg-type]
        body = chunked(EVENTS)
        reply.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body[:9])
        status, headers, rest = await reply.head()
        reply.framing = framing_for(status, headers, "POST")
        got = reply.start_body(rest)
        reply.data_received(body[9:30])
        reply.data_received(body[30:])  # the end of the body, and no close from the server
        while piece := await reply.received():
            got += piece
        assert socket.closed  # (the relay hangs up itself)
        return got

    assert asyncio.run(relayed()) == b"".join(EVENTS)


def test_a_server_that_sends_garbage_frames_ends_the_reply():
    async def relayed() -> bytes:
        reply = UpstreamReply(b"")
        reply.connection_made(Socket())  # type: ignore[arg-type]
        reply.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        status, headers, rest = await reply.head()
        reply.framing = framing_for(status, headers, "POST")
        got = reply.start_body(rest)
        reply.data_received(b"not hex at all\r\n")
        return got + await reply.received()

    assert asyncio.run(relayed()) == b"hello"


def test_a_silent_server_is_hung_up_on_after_its_limit():
    async def silent() -> tuple[bool, float]:
        reply, socket = UpstreamReply(b"", idle_limit_s=0.2), Socket()
        reply.connection_made(socket)  # type: ignore[arg-type]
        started = time.monotonic()
        while not socket.closed and time.monotonic() - started < 5:
            await asyncio.sleep(0.02)
        return reply.timed_out, time.monotonic() - started

    timed_out, waited = asyncio.run(silent())
    assert timed_out and 0.2 <= waited < 5


def test_an_upstream_paused_for_a_slow_client_is_not_taken_for_a_silent_one():
    from localchat.serve.apis.chat_completions.byte_relay import HELD_BYTES

    async def paused() -> bool:
        reply, socket = UpstreamReply(b"", idle_limit_s=0.2), Socket()
        reply.connection_made(socket)  # type: ignore[arg-type]
        reply.data_received(b"x" * (HELD_BYTES + 1))  # nobody takes it: reading paused
        await asyncio.sleep(0.8)
        return socket.closed or reply.timed_out

    assert not asyncio.run(paused())
