"""What ``localchat serve`` enforcing formats gives and costs, against plain mlx_lm.server.

    uv run python scripts/bench_server_formats.py [--model smollm2] [--rounds 8]

Two servers side by side, started here: ``localchat serve`` (mlx_lm.server's engine with the
grammar mask) and ``serve --plain`` (mlx_lm.server as it is), both through the openai SDK:

1. validity: a prompt set × schemas with ``response_format`` json_schema, greedy: the share of
   replies that parse and validate, on each server;
2. the mask's cost: on the enforcing server, rounds of the same prompt asked free and under a
   schema that forces a long string (so both decode about as many tokens), in alternating order;
   decode tok/s is timed by the client from the first content delta to the last, with the server's
   token count; printed as the median of the rounds' ratios (target ≥ 0.95);
3. batching kept: four requests with four different schemas sent at once, streamed: all valid, and
   every one's first token arrives before any reply has ended (served one at a time, a later request
   could start only when an earlier one had finished).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import jsonschema
import openai

from localchat.environment import collect
from localchat.registry import resolve
from localchat.server.launch import free_port, start_ready

PROMPTS = ["Describe Ada Lovelace.", "Tell me about a pilot from Paris.", "Who are you?",
           "Write about the sea.", "Give me a recipe."]
SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "enum+nested": {"type": "object", "properties": {"role": {"enum": ["engineer", "poet", "pilot"]},
                                                     "home": {"type": "object", "properties": {
                                                         "city": {"type": "string", "maxLength": 16}},
                                                              "required": ["city"], "additionalProperties": False}},
                    "required": ["role", "home"], "additionalProperties": False},
    "list": {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                        "minItems": 2, "maxItems": 3}},
             "required": ["items"], "additionalProperties": False},
}
LONG = {"type": "object", "properties": {"story": {"type": "string", "minLength": 400, "maxLength": 600}},
        "required": ["story"], "additionalProperties": False}


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def valid(text: str | None, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text or ""), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def ask(client: openai.OpenAI, prompt: str, **fields) -> str | None:
    reply = client.chat.completions.create(model="default_model", messages=[{"role": "user", "content": prompt}],
                                           temperature=0, max_tokens=160, **fields)
    return reply.choices[0].message.content


def decode_rate(client: openai.OpenAI, prompt: str, tokens: int, **fields) -> float | None:
    """tok/s from the first content delta to the last, with the server's count of the tokens."""
    stream = client.chat.completions.create(model="default_model", messages=[{"role": "user", "content": prompt}],
                                            temperature=0, max_tokens=tokens, stream=True,
                                            stream_options={"include_usage": True}, **fields)
    first = last = None
    count = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
        if chunk.usage is not None:
            count = chunk.usage.completion_tokens
    return (count - 1) / (last - first) if first and last and last > first and count > 1 else None


def validity(ours: openai.OpenAI, plain: openai.OpenAI) -> None:
    print("\n1. valid replies, response_format json_schema, greedy")
    for name, client in (("localchat serve", ours), ("mlx_lm.server (plain)", plain)):
        good = sum(valid(ask(client, p, response_format=fmt(s)), s) for p in PROMPTS for s in SCHEMAS.values())
        print(f"   {name:<24} {good}/{len(PROMPTS) * len(SCHEMAS)} valid ({good / (len(PROMPTS) * len(SCHEMAS)):.0%})")


def mask_cost(ours: openai.OpenAI, rounds: int) -> None:
    print("\n2. decode speed with and without the mask (the enforcing server, alternating)")
    ratios, free_rates, masked_rates = [], [], []
    for i in range(rounds):
        prompt = PROMPTS[i % len(PROMPTS)]
        arms = [("free", {}), ("masked", {"response_format": fmt(LONG)})]
        rates = {}
        for name, fields in (arms if i % 2 == 0 else arms[::-1]):
            rates[name] = decode_rate(ours, prompt, 96, **fields)
        if rates["free"] and rates["masked"]:
            free_rates.append(rates["free"])
            masked_rates.append(rates["masked"])
            ratios.append(rates["masked"] / rates["free"])
    print(f"   free {statistics.median(free_rates):.1f} tok/s · masked {statistics.median(masked_rates):.1f} tok/s · "
          f"median ratio masked/free ×{statistics.median(ratios):.3f} over {len(ratios)} rounds (target ≥ 0.95)")


def _streamed(client: openai.OpenAI, prompt: str, fields: dict, out: dict, key: int) -> None:
    """(first content delta, last, text), timed by the client."""
    stream = client.chat.completions.create(model="default_model", messages=[{"role": "user", "content": prompt}],
                                            temperature=0, max_tokens=160, stream=True, **fields)
    first, parts = None, []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            parts.append(chunk.choices[0].delta.content)
    out[key] = (first, time.perf_counter(), "".join(parts))


def batching(ours: openai.OpenAI) -> None:
    """Four formats at once. Served together (batched), every request has its first token before any
    has finished; served one at a time, the later ones could only start when the first had ended."""
    print("\n3. four formats at once")
    long = [{"type": "object", "properties": {key: {"type": "string", "minLength": 120, "maxLength": 160}},
             "required": [key], "additionalProperties": False} for key in ("story", "poem", "note", "tale")]
    out: dict[int, tuple] = {}
    threads = [threading.Thread(target=_streamed, args=(ours, PROMPTS[i], {"response_format": fmt(schema)}, out, i))
               for i, schema in enumerate(long)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = sum(valid(out[i][2], schema) for i, schema in enumerate(long))
    last_first = max(first for first, _, _ in out.values()) - started
    first_end = min(end for _, end, _ in out.values()) - started
    together = "batched: every first token came before any reply ended" if last_first < first_end else \
        "NOT batched: a request started only after another had ended"
    print(f"   {ok}/4 valid; last first token at {last_first:.2f}s, first reply done at {first_end:.2f}s: {together}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    env = collect()
    print(f"# {env.chip or env.machine} · {env.os} · MLX on {env.mlx_device} · mlx-lm {env.mlx_lm_version} · "
          f"model {args.model}")
    ref = resolve(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        ours = start_ready(ref, port=free_port(), log=Path(tmp) / "ours.log")
        plain = start_ready(ref, port=free_port(), log=Path(tmp) / "plain.log", plain=True)
        try:
            clients = [openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0) for s in (ours, plain)]
            validity(*clients)
            mask_cost(clients[0], args.rounds)
            batching(clients[0])
        finally:
            ours.stop()
            plain.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
