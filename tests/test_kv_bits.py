"""``serve --kv-bits``: a quantized KV cache that keeps the batch (``serve.engine.quantized_kv``).

In-process against mlx_lm's own ``BatchGenerator`` (the demo model: greedy answers alone, together
and joining mid-decode; the cache's bytes; a file's round trip), then real ``serve`` children
(demo, SmolLM2): four streamed requests decoded together, each equal to its answer alone, ``ps``
showing the bits, a hit from disk after a restart; and the options refused in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from localchat.errors import UsageError
from localchat.fit.estimate import KVSettings, kv_cache_bytes
from localchat.fit.shape import local_shape
from localchat.registry import local_dir, resolve
from localchat.serve.kv_options import engine_args, group_for, parse_kv_choice
from routed import Serve

PROMPT_WORDS = (3, 40, 9, 120)  # several lengths: the batch is left-padded to the longest


def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode("hello " * n + "what is the code?") for n in PROMPT_WORDS]


def decoded(model, make, batch: list[list[int]], joins: list[int] | None = None, max_tokens: int = 24):
    """Greedy tokens of each prompt through one ``BatchGenerator``; ``joins``: the step at which
    each is inserted (a request joining a running batch)."""
    from mlx_lm.generate import BatchGenerator

    generator = BatchGenerator(model, completion_batch_size=8, prefill_batch_size=8)
    joins = joins or [0] * len(batch)
    out: dict[int, list[int]] = {}
    which: dict[int, int] = {}
    step = 0
    try:
        while len(out) < len(batch) or any(len(v) < max_tokens for v in out.values()):
            for i, prompt in enumerate(batch):
                if joins[i] == step:
                    (uid,) = generator.insert_segments(segments=[[prompt]], max_tokens=[max_tokens],
                                                       caches=[make(model)])
                    which[uid], out[i] = i, []
            for response in generator.next()[1]:
                out[which[response.uid]].append(response.token)
            step += 1
            assert step < 1000
    finally:
        generator.close()
    return [out[i] for i in range(len(batch))]


def quantizing_maker(bits: int | None, start: int = 0):
    from mlx_lm.models.cache import make_prompt_cache

    from localchat.serve.engine.quantized_kv import KVQuantization, quantizing

    return quantizing(make_prompt_cache, KVQuantization(bits=bits, group_size=32, start=start) if bits else None)


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_batch_answers_each_request_as_it_is_answered_alone(demo, bits):
    model, tokenizer = demo
    make, batch = quantizing_maker(bits), prompts(tokenizer)
    alone = [decoded(model, make, [p])[0] for p in batch]
    assert decoded(model, make, batch) == alone
    assert decoded(model, make, batch, joins=[0, 3, 7, 12]) == alone  # joining (and leaving) mid-decode


def test_the_quantized_cache_holds_a_fraction_of_the_bytes_and_mlx_lms_attention_reads_it(demo):
    import mlx.core as mx

    model, tokenizer = demo
    prompt = mx.array([prompts(tokenizer)[3]])
    held = {}
    for bits in (None, 8, 4):
        cache = quantizing_maker(bits)(model)
        model(prompt, cache=cache)
        mx.eval([c.state for c in cache])
        held[bits] = sum(c.nbytes for c in cache)
        assert all(hasattr(c, "bits") == (bits is not None) for c in cache)  # (what picks quantized attention)
    # the demo computes in float32: a value is 4 bytes, or its bits and a group of 32's float32 scale and bias
    assert held[8] == held[None] * (1 + 2 * 4 / 32) / 4 and held[4] == held[None] * (0.5 + 2 * 4 / 32) / 4


def test_a_cache_stays_full_precision_until_its_start_and_a_batch_joined_to_a_quantized_row_quantizes(demo):
    import mlx.core as mx

    from localchat.serve.engine.quantized_kv import QuantizingKVCache

    model, _ = demo
    make = quantizing_maker(8, start=64)
    short, long = make(model), make(model)
    model(mx.array([[5] * 20]), cache=short)
    model(mx.array([[5] * 50]), cache=long)  # 50 held: below the start
    model(mx.array([[5] * 30]), cache=long)  # written at 50 held: still below
    assert not short[0].quantized and not long[0].quantized
    model(mx.array([[5]]), cache=long)  # 80 held: this write quantizes
    assert long[0].quantized and long[0].offset == 81 and not short[0].quantized
    batch = [QuantizingKVCache.merge([s, q]) for s, q in zip(short, long)]
    assert all(b.quantized for b in batch)  # (a batch has one layout a layer: the short row quantized too)
    assert [b.extract(0).offset for b in batch[:1]] == [20] and batch[0].extract(1).offset == 81


def test_a_quantized_cache_saved_and_read_continues_as_the_one_kept_in_memory(demo, tmp_path):
    import mlx.core as mx
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    from localchat.serve.engine.quantized_kv import KVQuantization, engine_form, stored_form

    model, tokenizer = demo
    make, prompt = quantizing_maker(8), prompts(tokenizer)[1]
    cache = make(model)
    model(mx.array([prompt[:-1]]), cache=cache)
    mx.eval([c.state for c in cache])
    save_prompt_cache(str(tmp_path / "c.safetensors"), stored_form(cache))
    read = engine_form(load_prompt_cache(str(tmp_path / "c.safetensors")), KVQuantization(8, 32))
    first = model(mx.array([prompt[-1:]]), cache=cache)
    again = model(mx.array([prompt[-1:]]), cache=read)
    assert mx.array_equal(first, again)
    assert decoded(model, lambda _: read, [prompt[-1:]]) == decoded(model, lambda _: cache, [prompt[-1:]])


def test_the_options_are_checked_before_anything_loads():
    assert parse_kv_choice(["8", "demo=4"], None, None).bits_for(frozenset({"demo"})) == 4
    assert parse_kv_choice(["8"], None, None).start == 0
    for given in (["7"], ["=4"], ["demo=x"], ["16"], ["²"], [""], ["demo="]):
        with pytest.raises(UsageError, match="--kv-bits"):
            parse_kv_choice(given, None, None)
    with pytest.raises(UsageError, match="group"):
        parse_kv_choice(["8"], 48, None)
    assert group_for(32, None, "demo") == 32 and group_for(64, None, "smollm2") == 64
    with pytest.raises(UsageError, match="does not divide demo's head dimension"):
        group_for(32, 64, "demo")
    assert engine_args(KVSettings(bits=8, group_size=32)) == ("--kv-bits", "8", "--kv-group-size", "32",
                                                              "--quantized-kv-start", "0")


@pytest.mark.parametrize("args, said", [
    (["--kv-bits", "7"], "--kv-bits 7: the bits must be one of 2, 3, 4, 5, 6, 8"),
    (["-m", "demo", "--kv-bits", "8", "--kv-group-size", "64"], "does not divide demo's head dimension (32)"),
    (["-m", "demo", "--", "--kv-bits", "4"], "--kv-bits is serve's own option now"),
])
def test_bad_kv_options_are_one_line_and_exit_2(args, said):
    done = subprocess.run([sys.executable, "-m", "localchat", "serve", "--dry-run", *args], capture_output=True,
                          text=True, timeout=60, env=os.environ | {"COLUMNS": "200"})
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_fit_counts_serves_cache_at_its_bits():
    shape = local_shape(local_dir(resolve("demo")))
    full = kv_cache_bytes(shape, 1024)
    eight = kv_cache_bytes(shape, 1024, KVSettings(bits=8, group_size=32, on_write=True))
    later = kv_cache_bytes(shape, 1024, KVSettings(bits=8, group_size=32, quantized_start=512, on_write=True))
    assert eight < full / 3 and eight < later  # (at its start, a full cache and its quantized copy at once)


# --- real engines -----------------------------------------------------------------------------------


def streamed(serve: Serve, model: str, number: int, max_tokens: int = 24) -> str:
    """One streamed greedy request's text."""
    text = []
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"Remember the code harbor {number}{number}. " * (number + 1)
                          + "What is the code?"}]}
    with httpx.stream("POST", serve.url + "/v1/chat/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices") or [{}]
                piece = choices[0].get("delta", {}).get("content")
                if piece:
                    text.append(piece)
    return "".join(text)


def four_at_once(serve: Serve, model: str, max_tokens: int = 24) -> list[str]:
    answers: list[str] = [""] * 4

    def one(number: int) -> None:
        answers[number] = streamed(serve, model, number, max_tokens)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def kv_row(serve: Serve) -> str:
    shown = subprocess.run([sys.executable, "-m", "localchat", "ps", "--port", str(serve.port)], capture_output=True,
                           text=True, timeout=60, env=os.environ | {"COLUMNS": "200"})
    return shown.stdout


def engine_kv(serve: Serve) -> dict:
    return httpx.get(serve.held()[0]["engine_url"].removesuffix("/v1") + "/localchat/kv", timeout=10).json()


def test_serve_kv_bits_8_decodes_four_clients_together_each_as_alone_and_ps_shows_it(tmp_path):
    serve = Serve(tmp_path / "home", "-m", "demo", "--kv-bits", "8")
    try:
        alone = [streamed(serve, "demo", n) for n in range(4)]
        assert engine_kv(serve)["largest_batch"] == 1
        for _ in range(5):  # the toy answers in milliseconds: on a busy machine four requests may not overlap
            together = four_at_once(serve, "demo")
            assert together == alone and all(alone)  # every round, batched or not
            engine = engine_kv(serve)
            if engine["largest_batch"] >= 2:
                break
        assert engine["largest_batch"] >= 2  # decoded in one batch (mlx_lm.server's --kv-bits: one at a time)
        assert engine["bits"] == 8 and engine["group_size"] == 32 and engine["start"] == 0
        row = serve.held()[0]
        assert row["kv_bits"] == 8 and row["kv_bytes"] > 0
        assert "(8-bit)" in kv_row(serve)
    finally:
        serve.stop()


def test_a_request_joining_a_running_quantized_batch_answers_as_alone(tmp_path):
    """A long reply (its end token banned) is decoding when a second request arrives: the second
    joins its batch, and its answer is the one it gets alone."""
    from mlx_lm.utils import load_tokenizer

    ends = load_tokenizer(local_dir(resolve("demo"))).eos_token_ids
    long = {"model": "demo", "stream": True, "max_tokens": 600, "temperature": 0,
            "logit_bias": {str(end): -1000 for end in ends},
            "messages": [{"role": "user", "content": "Tell a long story."}]}
    serve = Serve(tmp_path / "home", "-m", "demo", "--kv-bits", "8")
    try:
        alone = streamed(serve, "demo", 2)
        joined: list[str] = []
        with httpx.stream("POST", serve.url + "/v1/chat/completions", json=long, timeout=300) as response:
            lines = response.iter_lines()
            next(line for line in lines if '"content"' in line)  # the long reply is decoding
            joined.append(streamed(serve, "demo", 2))
            for _ in lines:  # (the rest of the long reply)
                pass
        assert joined == [alone] and engine_kv(serve)["largest_batch"] >= 2
    finally:
        serve.stop()


def test_a_quantized_prompt_cache_read_from_disk_after_a_restart_gives_the_same_answer(tmp_path):
    home = tmp_path / "home"
    text = " ".join(f"note{i % 97} says {i * 7 % 13}" for i in range(80)) + ". What does note5 say?"
    body = {"model": "demo", "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": text}]}
    first = Serve(home, "-m", "demo", "--kv-bits", "8")
    try:
        cold = httpx.post(first.url + "/v1/chat/completions", json=body, timeout=300).json()
        warm = httpx.post(first.url + "/v1/chat/completions", json=body, timeout=300).json()  # from memory
        deadline = time.monotonic() + 30
        while not list((home / "prompt-cache").glob("*/*.safetensors")) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        first.stop()
    again = Serve(home, "-m", "demo", "--kv-bits", "8")
    try:
        disk = httpx.post(again.url + "/v1/chat/completions", json=body, timeout=300).json()
        engine_log = (home / "logs" / f"server-{again.port}.log").read_text()
    finally:
        again.stop()
    answer = cold["choices"][0]["message"]["content"]
    assert warm["choices"][0]["message"]["content"] == answer == disk["choices"][0]["message"]["content"]
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 200
    assert disk["usage"]["prompt_tokens_details"]["cached_tokens"] > 200 and "tokens from disk" in engine_log


def test_smollm2_kv_bits_8_answers_four_clients_at_once_as_each_alone(tmp_path, smollm2):
    serve = Serve(tmp_path / "home", "-m", str(smollm2), "--kv-bits", "8")
    try:
        alone = [streamed(serve, str(smollm2), n, max_tokens=6) for n in range(4)]  # (~7 tok/s here)
        assert four_at_once(serve, str(smollm2), max_tokens=6) == alone and all(alone)
        assert engine_kv(serve)["largest_batch"] >= 2
    finally:
        serve.stop()
