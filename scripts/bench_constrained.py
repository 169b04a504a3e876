"""What the grammar's mask costs and buys, in-process: valid replies and decode speed, with and without.

    uv run python scripts/bench_constrained.py [--models smollm2,demo] [--repeats 1]

For each model, a fixed set of prompts × schemas (an object with required fields, an enum, an array
of numbers, a nested object), each asked twice side by side, alternating which goes first: the
format's instruction in the system message and no mask (the reply checked after), then the same
with the mask. Printed: valid replies each way, decode tok/s each way and their ratio (median of
the per-prompt ratios, measured in one run, on one clock), the mask time per masked token, and the
grammar's compile time (inside TTFT). Targets: 100 % valid with the mask; decode with the mask ≥
0.97× without on SmolLM2 and ≥ 0.90× on the demo.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from localchat.backends import GenerationParams
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.environment import collect
from localchat.grammar.formats import AnswerFormat, with_instruction

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
                                    ("valid", result.invalid is None and result.accepted), ("tps", result.stats.decode_tps),
                                    ("tokens", result.stats.completion_tokens), ("mask_s", result.stats.mask_s),
                                    ("masked", result.stats.masked_tokens), ("check_s", compile_s))}})
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
    print("| model | schema | prompt | valid without | valid with | tok/s without | tok/s with | mask µs/token |")
    print("|---|---|---|---|---|---|---|---|")
    totals = {}
    for model in args.models.split(","):
        rows = run_model(model, args.repeats)
        for r in rows:
            mask = f"{r['with_mask_s'] / r['with_masked'] * 1e6:.0f}" if r["with_masked"] else "–"
            print(f"| {model} | {r['schema']} | {r['prompt']} | {'yes' if r['without_valid'] else 'no'} | "
                  f"{'yes' if r['with_valid'] else 'NO'} | {r['without_tps'] or 0:.1f} | {r['with_tps'] or 0:.1f} | {mask} |")
        totals[model] = summary(rows)
    print("\n| model | valid without the mask | valid with it | decode tok/s without | with | ratio (median of pairs) "
          "| target | mask µs a token | schema check and compile |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, s in totals.items():
        target = targets.get(model)
        met = "" if target is None or s["ratio"] is None else (" met" if s["ratio"] >= target else " NOT met")
        print(f"| {model} | {s['valid_without']}/{s['n']} | {s['valid_with']}/{s['n']} | {s['tps_without']:.1f} | "
              f"{s['tps_with']:.1f} | ×{s['ratio']:.3f} | ≥ {target}{met} | {s['mask_us']:.0f} | {s['check_ms']:.1f} ms |")
    print(f"\nmeasured on {collect().hardware_label}, in one run, the two arms alternating")


if __name__ == "__main__":
    main()
