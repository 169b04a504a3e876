"""The mask step by step: what it allows is the grammar's own choice at every prefix, whichever way
it reads the reply (the token list mlx_lm passes, or the token its sampler chose last), through the
stretches the grammar forces (let through without the matcher) and back after a rejected draft."""

from __future__ import annotations

import pytest

from localchat.grammar.answer_formats import AnswerFormat
from localchat.grammar.compile import grammars, llg_tokenizer
from localchat.grammar.mask import MaskedDecoding

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "unsure"]},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["answer", "score"], "additionalProperties": False}
FORMAT = AnswerFormat("Answer in JSON.", SCHEMA, name="step")


@pytest.fixture(scope="module")
def llg(demo):
    _, tokenizer = demo
    return llg_tokenizer(tokenizer, len(tokenizer._tokenizer))


def allowed_by(processor: MaskedDecoding, prefix: list[int], width: int) -> set[int]:
    import mlx.core as mx

    out = processor(mx.array(prefix, dtype=mx.int32), mx.zeros((1, width)))
    return {i for i, finite in enumerate(mx.isfinite(out[0]).tolist()) if finite}


def grammar_allows(llg, prefix: list[int]) -> set[int]:
    """What a fresh matcher fed ``prefix`` allows next: the grammar's own answer."""
    import llguidance.numpy as llg_numpy
    import numpy as np
    from llguidance import LLMatcher

    matcher = LLMatcher(llg, grammars(FORMAT, [], None, llg).answer)
    assert matcher.consume_tokens(prefix)
    mask = llg_numpy.allocate_token_bitmask(1, llg.vocab_size)
    llg_numpy.fill_next_token_bitmask(matcher, mask)
    bits = np.unpackbits(mask[0].view(np.uint8), bitorder="little")
    return {int(i) for i in np.flatnonzero(bits[:llg.vocab_size])}


def walk(processor: MaskedDecoding, llg, choose, steps: int = 40) -> tuple[list[int], dict[int, set[int]]]:
    """A reply written through ``processor``, ``choose`` picking among the allowed tokens, and what
    each step allowed, checked against the grammar's own answer."""
    prefix: list[int] = []
    seen: dict[int, set[int]] = {}
    while len(prefix) < steps:
        allowed = allowed_by(processor, prefix, llg.vocab_size)
        assert allowed and allowed <= grammar_allows(llg, prefix), prefix  # never a token the grammar refuses
        seen[len(prefix)] = allowed
        token = choose(allowed)
        if token in llg.eos_tokens:
            break
        prefix.append(token)
    return prefix, seen


def drafting_processor(llg) -> MaskedDecoding:
    """A processor that reads the list whole each call, as with a draft model (the list may shrink)."""
    return MaskedDecoding(llg, grammars(FORMAT, [], None, llg), offset=0, decode=lambda ids: "", drafting=True)


def test_each_step_allows_only_what_the_grammar_allows_and_the_forced_stretches_are_single_tokens(llg):
    _, seen = walk(drafting_processor(llg), llg, max)
    assert any(len(a) == 1 for a in seen.values()) and any(len(a) > 1 for a in seen.values())


def test_rejected_drafts_back_and_forth_between_two_replies_mask_as_a_fresh_start_would(llg):
    """Two replies that part at the answer's first choice, their prefixes fed in turn to one
    processor (each call a draft rejected back to where they part): each step allows what a fresh
    processor allows for that prefix."""
    high, seen_high = walk(drafting_processor(llg), llg, max)
    low, seen_low = walk(drafting_processor(llg), llg, min)
    assert high != low
    processor = drafting_processor(llg)
    for n in range(min(len(high), len(low)) + 1):
        for prefix, seen in ((high, seen_high), (low, seen_low)):
            assert allowed_by(processor, prefix[:n], llg.vocab_size) == seen[n], (n, prefix[:n])


def test_reading_the_sampler_or_the_token_list_masks_the_same_reply(demo):
    """In mlx_lm's own loop with the demo: the processor fed by the sampler it wraps (the in-process
    backend's way) and the one reading the list mlx_lm passes choose the same tokens, and they parse."""
    import json

    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    from localchat.backends.inproc import InProcessBackend

    model, tokenizer = demo
    backend = InProcessBackend(model, tokenizer, "demo")
    ids = backend.template.ids([{"role": "user", "content": "Is Paris in France?"}])
    replies = []
    for wrapped in (True, False):
        processor = backend.grammar.for_reply(FORMAT, [], backend.template.traits, ids, offset=len(ids))
        sampler = processor.sampler(make_sampler(0.0)) if wrapped else make_sampler(0.0)
        out = [r.token for r in stream_generate(model, tokenizer, mx.array(ids), max_tokens=60, sampler=sampler,
                                                logits_processors=[processor])]
        replies.append(out)
        assert processor.masked >= len(out) - 1
    assert replies[0] == replies[1]
    text = tokenizer.decode([t for t in replies[0] if t not in tokenizer.eos_token_ids])
    FORMAT.check(text)
    assert set(json.loads(text)) == {"answer", "score"}


def test_a_tool_schema_with_defs_is_enforced_and_one_the_grammar_cannot_take_is_left_out_alone():
    """pydantic writes nested models as ``$defs`` and ``$ref``: inside the call grammar's ``anyOf``
    they pointed nowhere, and every in-process call failed ("Pointer '/$defs/Place' does not exist")."""
    from mlx_lm import load

    from localchat.backends import GenerationParams, ToolCall
    from localchat.backends.inproc import InProcessBackend
    from localchat.demo_codes import MODEL_DIR

    def tool(name: str, parameters: dict) -> dict:
        return {"type": "function", "function": {"name": name, "description": f"{name}.", "parameters": parameters}}

    add = tool("add", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]})
    travel = tool("travel", {"$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}},
                             "type": "object", "properties": {"to": {"$ref": "#/$defs/Place"}}, "required": ["to"]})
    broken = tool("broken", {"type": "object", "properties": {"x": {"$ref": "#/$defs/Nowhere"}}})
    model, tokenizer = load(str(MODEL_DIR.parent / "demo_tools_model"))
    backend = InProcessBackend(model, tokenizer, "demo-tools")
    backend.offer_tools([add, travel, broken])
    assert list(backend.refused_tools) == ["broken"] and "does not exist" in backend.refused_tools["broken"]
    assert [t["function"]["name"] for t in backend.template.tools] == ["add", "travel"]
    events = list(backend.stream([{"role": "user", "content": "What is 2 plus 3?"}], GenerationParams(max_tokens=48)))
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, c.problem) for c in calls] == [("add", None)], events
