"""Which structured-generation library localchat uses: llguidance, outlines-core and xgrammar, side by side.

    python scripts/compare_grammar_libraries.py TOKENIZER_DIR [TOKENIZER_DIR …]

For each tokenizer (the demo's, SmolLM2's) and each schema of ``SCHEMAS``, each library compiles the
schema, then walks a valid answer token by token as decoding would: the next-token mask computed,
the token taken. Printed: compile time, mask time per token (median and p90), and whether the
library accepted the whole answer and allowed the end there. One process, one clock, the libraries
alternating per schema. xgrammar needs torch, which localchat does not depend on; run this in a
scratch environment (``pip install llguidance outlines-core xgrammar torch transformers numpy``), not
in localchat's own.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

SCHEMAS = {
    "person (object, required fields)": ({"type": "object", "properties": {
        "name": {"type": "string"}, "born": {"type": "integer"}, "known_for": {"type": "string"}},
        "required": ["name", "born", "known_for"], "additionalProperties": False},
        {"name": "Ada Lovelace", "born": 1815, "known_for": "the first published algorithm"}),
    "enum": ({"type": "object", "properties": {"answer": {"enum": ["yes", "no", "unsure"]}}, "required": ["answer"],
              "additionalProperties": False}, {"answer": "unsure"}),
    "array of numbers": ({"type": "object", "properties": {"values": {"type": "array", "items": {"type": "number"}}},
                          "required": ["values"], "additionalProperties": False}, {"values": [3.5, 2, 17, 40.25]}),
    "nested object": ({"type": "object", "properties": {"city": {"type": "object", "properties": {
        "name": {"type": "string"}, "population": {"type": "integer"},
        "location": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                     "required": ["lat", "lon"], "additionalProperties": False}},
        "required": ["name", "population", "location"], "additionalProperties": False}},
        "required": ["city"], "additionalProperties": False},
        {"city": {"name": "Lyon", "population": 522000, "location": {"lat": 45.76, "lon": 4.84}}}),
}


def llguidance_walk(tokenizer, schema, ids):
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    started = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer)
    tok_s = time.perf_counter() - started
    started = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults={
        "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
    matcher = llguidance.LLMatcher(lltok, grammar)
    compile_s = time.perf_counter() - started
    mask = llguidance.numpy.allocate_token_bitmask(1, lltok.vocab_size)
    times, ok = [], not matcher.is_error()
    for token in ids:
        t = time.perf_counter()
        llguidance.numpy.fill_next_token_bitmask(matcher, mask)
        times.append(time.perf_counter() - t)
        allowed = bool((int(mask[0, token // 32]) >> (token % 32)) & 1)
        ok = ok and allowed and matcher.consume_token(token)
    llguidance.numpy.fill_next_token_bitmask(matcher, mask)
    ends = bool((int(mask[0, lltok.eos_token // 32]) >> (lltok.eos_token % 32)) & 1)
    return tok_s, compile_s, times, ok and ends


def outlines_walk(tokenizer, schema, ids):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    started = time.perf_counter()
    eos = tokenizer.eos_token_id
    decoder = tokenizer.backend_tokenizer.decoder
    vocabulary: dict[str, list[int]] = {}
    for token, index in tokenizer.get_vocab().items():
        if index == eos:
            continue
        text = decoder.decode([token]) if decoder else token  # byte-level pieces as their text
        vocabulary.setdefault(text, []).append(index)
    vocab = Vocabulary(eos, vocabulary)
    tok_s = time.perf_counter() - started
    started = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(schema), whitespace_pattern=r"[ ]?"), vocab)
    guide = Guide(index)
    compile_s = time.perf_counter() - started
    times, ok = [], True
    for token in ids:
        t = time.perf_counter()
        allowed = guide.get_tokens()
        times.append(time.perf_counter() - t)
        ok = ok and token in allowed
        if not ok:
            break
        guide.advance(token)
    return tok_s, compile_s, times, ok and guide.is_finished()


def xgrammar_walk(tokenizer, schema, ids):
    import xgrammar as xgr

    started = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    tok_s = time.perf_counter() - started
    started = time.perf_counter()
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - started
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    times, ok = [], True
    for token in ids:
        t = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - t)
        allowed = bool((int(mask[0, token // 32]) >> (token % 32)) & 1)
        ok = ok and allowed and matcher.accept_token(token)
    return tok_s, compile_s, times, ok and matcher.accept_token(tokenizer.eos_token_id)


LIBRARIES = {"llguidance": llguidance_walk, "outlines-core": outlines_walk, "xgrammar": xgrammar_walk}


def main() -> None:
    from transformers import PreTrainedTokenizerFast

    for directory in sys.argv[1:]:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
        print(f"\n## {Path(directory).name} (vocabulary {len(tokenizer):,})\n")
        print("| schema | library | tokenizer read | compile | mask median | mask p90 | tokens | answer accepted |")
        print("|---|---|---|---|---|---|---|---|")
        for name, (schema, answer) in SCHEMAS.items():
            ids = tokenizer(json.dumps(answer, separators=(", ", ": ")), add_special_tokens=False)["input_ids"]
            for library, walk in LIBRARIES.items():
                try:
                    tok_s, compile_s, times, ok = walk(tokenizer, schema, ids)
                except Exception as exc:  # noqa: BLE001 - a library's refusal is a result here
                    print(f"| {name} | {library} | – | failed: {type(exc).__name__}: {str(exc)[:60]} | | | | |")
                    continue
                times.sort()
                p90 = times[int(0.9 * (len(times) - 1))]
                print(f"| {name} | {library} | {tok_s * 1e3:.0f} ms | {compile_s * 1e3:.1f} ms | "
                      f"{statistics.median(times) * 1e6:.0f} µs | {p90 * 1e6:.0f} µs | {len(ids)} | "
                      f"{'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    main()
