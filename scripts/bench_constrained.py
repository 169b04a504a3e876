"""What the grammar's mask costs and buys, in-process: valid replies and decode speed, with and without.

    uv run python scripts/bench_constrained.py [--models smollm2,demo] [--repeats 1]

For each model, a fixed set of prompts × schemas (an object with required fields, an enum, an array
of numbers, a nested object), each asked twice through ``ChatSession`` side by side, alternating
which goes first: the format's instruction in the system message and no mask (the reply checked
after), then the same with the mask: valid replies each way. Decode speed is then compared on
replies of the same length, in mlx_lm's own loop: the masked reply's tokens again, and as many
without the mask (the end of turn kept out, or the unmasked reply would stop after a few tokens
and be timed on a shorter context), in rounds alternating which goes first until each arm has
decoded for a second (each arm's median round kept); the ratio is the median of the
per-prompt ratios, measured in one run on one clock. Also printed: the mask time per masked token
and the grammar's compile time (inside TTFT). Targets: 100 % valid with the mask; decode with the
mask ≥ 0.97× without on SmolLM2 and ≥ 0.90× on the demo.
"""

from __future__ import annotations

import argparse
import statistics
import time

from localchat.backends import GenerationParams
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.environment import collect
from localchat.grammar.answer_formats import AnswerFormat, with_instruction

TIMED_S, MAX_ROUNDS = 1.0, 40  # decoding timed for each arm of a pair, at least (see equal_length_speeds)

SCHEMAS = {
    "object with required fields": ({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "born": {"type": "integer", "minimum": 0, "maximum": 2100},
        "known_for": {"type": "string", "maxLength": 80}}, "required": ["name", "born", "known_for"],
        "additionalProperties": False}, ["Describe Ada Lovelace.", "Describe Alan Turing."]),
    "enum": ({"type": "object", "properties": {"answer": {"enum": ["yes", "no", "unsure"]}}, "required": ["answer"],
              "additionalProperties": False}, ["Is Paris in France?", "Is the moon made of cheese?"]),
    "array of numbers": ({"type": "object", "properties": {"values": {"type": "array", "items": {
        "type": "integer", "minimum": 0, "maximum": 1000}, "minItems": 1, "maxItems": 5}}, "required": ["values"],
        "additionalProperties": False}, ["List three prime numbers.", "List the first four even numbers."]),
    "nested object": ({"type": "object", "properties": {"city": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000}},
        "required": ["name", "country", "population"], "additionalProperties": False}},
        "required": ["city"], "additionalProperties": False}, ["Describe the city of Lyon.", "Describe Tokyo."]),
}


def answer_format(name: str, schema: dict) -> AnswerFormat:
    import json

    return AnswerFormat(f"Answer in JSON that matches this JSON Schema: {json.dumps(schema, separators=(',', ':'))}",
                        schema, name=name.replace(" ", "-"))


def ask(backend, fmt: AnswerFormat, prompt: str, masked: bool, max_tokens: int):
    session = ChatSession(backend, Conversation(with_instruction("You are a helpful assistant.", fmt)),
                          GenerationParams(max_tokens=max_tokens, answer=fmt if masked else None), schema=fmt,
                          use_history=False)
    started = time.perf_counter()
    if masked:
        backend.grammar.check(fmt)
    checked = time.perf_counter() - started
    result = session.ask(prompt)
    return result, checked


def decode_tps(backend, fmt: AnswerFormat, prompt: str, masked: bool, tokens: int) -> tuple[float | None, int]:
    """Decode tok/s of one reply in mlx_lm's loop (first to last token): under the mask, or for
    exactly ``tokens`` unmasked tokens (the end of turn kept out)."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    messages = [{"role": "system", "content": with_instruction("You are a helpful assistant.", fmt)},
                {"role": "user", "content": prompt}]
    ids = backend.template.ids(messages)
    sampler = make_sampler(0.0)
    if masked:
        processor = backend.grammar.for_reply(fmt, [], backend.template.traits, ids, offset=len(ids))
        sampler = processor.sampler(sampler)  # as the in-process backend does
    else:
        eos = set(backend.tokenizer.eos_token_ids)
        ends = mx.array([t in eos for t in range(backend.model.args.vocab_size)])
        processor = lambda _, logits: mx.where(ends, mx.array(-float("inf"), logits.dtype), logits)  # noqa: E731
    times = []
    for _ in stream_generate(backend.model, backend.tokenizer, mx.array(ids), max_tokens=tokens,
                             sampler=sampler, logits_processors=[processor]):
        times.append(time.perf_counter())
    return ((len(times) - 1) / (times[-1] - times[0]) if len(times) > 2 else None), len(times)


def equal_length_speeds(backend, fmt: AnswerFormat, prompt: str, max_tokens: int, masked_first: bool) -> dict:
    """Each arm's median tok/s over alternating rounds, until each has decoded for ``TIMED_S``
    (one round when a reply takes that long): a reply of a few 2 ms steps, timed once on a shared
    machine, says more about its neighbours than about the mask."""
    _, length = decode_tps(backend, fmt, prompt, True, max_tokens)  # how long the masked reply is
    order = [True, False] if masked_first else [False, True]
    speeds: dict[bool, list[float]] = {True: [], False: []}
    timed = 0.0
    for _ in range(MAX_ROUNDS):
        for masked in order:
            tps, _ = decode_tps(backend, fmt, prompt, masked, length)
            if tps:
                speeds[masked].append(tps)
                timed += (length - 1) / tps / 2
        order.reverse()
        if timed >= TIMED_S:
            break
    median = {m: statistics.median(v) if v else None for m, v in speeds.items()}
    return {"with_tps": median[True], "without_tps": median[False], "tokens": length}


def run_model(model: str, repeats: int) -> list[dict]:
    from localchat.backends.inproc import load_inproc
    from localchat.registry import local_dir, resolve

    ref = resolve(model)
    backend = load_inproc(ref, local_dir(ref))
    _ = backend.grammar.llg  # read once, as a session's preparation does
    rows = []
    for name, (schema, prompts) in SCHEMAS.items():
        fmt = answer_format(name, schema)
        for round_ in range(repeats):
            for k, prompt in enumerate(prompts):
                order = (False, True) if (k + round_) % 2 == 0 else (True, False)
                results = {masked: ask(backend, fmt, prompt, masked, 160 if model == "demo" else 120)
                           for masked in order}
                rows.append({"model": model, "schema": name, "prompt": prompt,
                             **{f"{'with' if m else 'without'}_{key}": value for m, (result, compile_s) in
                                results.items() for key, value in (
                                    ("valid", result.invalid is None and result.accepted),
                                    ("tokens", result.stats.completion_tokens), ("mask_s", result.stats.mask_s),
                                    ("masked", result.stats.masked_tokens), ("check_s", compile_s))},
                             **equal_length_speeds(backend, fmt, prompt, 160 if model == "demo" else 120, order[0])})
    return rows


def summary(rows: list[dict]) -> dict:
    ratios = [r["with_tps"] / r["without_tps"] for r in rows if r["with_tps"] and r["without_tps"]]
    masked = sum(r["with_masked"] for r in rows)
    return {"n": len(rows), "valid_without": sum(r["without_valid"] for r in rows),
            "valid_with": sum(r["with_valid"] for r in rows),
            "tps_without": statistics.median([r["without_tps"] for r in rows if r["without_tps"]]),
            "tps_with": statistics.median([r["with_tps"] for r in rows if r["with_tps"]]),
            "ratio": statistics.median(ratios) if ratios else None,
            "mask_us": sum(r["with_mask_s"] for r in rows) / masked * 1e6 if masked else None,
            "check_ms": statistics.median([r["with_check_s"] for r in rows]) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,demo")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    targets = {"smollm2": 0.97, "demo": 0.90}
    print("| model | schema | prompt | valid without | valid with | tokens | tok/s without | tok/s with | mask "
          "µs/token |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals = {}
    for model in args.models.split(","):
        rows = run_model(model, args.repeats)
        for r in rows:
            mask = f"{r['with_mask_s'] / r['with_masked'] * 1e6:.0f}" if r["with_masked"] else "–"
            print(f"| {model} | {r['schema']} | {r['prompt']} | {'yes' if r['without_valid'] else 'no'} | "
                  f"{'yes' if r['with_valid'] else 'NO'} | {r['tokens']} | {r['without_tps'] or 0:.1f} | "
                  f"{r['with_tps'] or 0:.1f} | {mask} |")
        totals[model] = summary(rows)
    print("\n| model | valid without the mask | valid with it | decode tok/s without | with | ratio (median of pairs) "
          "| target | mask µs a token | schema check and compile |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, s in totals.items():
        target = targets.get(model)
        met = "" if target is None or s["ratio"] is None else (" met" if s["ratio"] >= target else " NOT met")
        print(f"| {model} | {s['valid_without']}/{s['n']} | {s['valid_with']}/{s['n']} | {s['tps_without']:.1f} | "
              f"{s['tps_with']:.1f} | ×{s['ratio']:.3f} | ≥ {target}{met} | {s['mask_us']:.0f} | {s['check_ms']:.1f} "
              "ms |")
    print(f"\nmeasured on {collect().hardware_label}, in one run, the two arms alternating; decode speeds on "
          "replies of the same length")


if __name__ == "__main__":
    main()
