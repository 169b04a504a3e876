"""mlx_lm's options in-process, each against mlx_lm's own output for the same option (greedy or
seeded), and KV reuse across turns with each; over HTTP, what is sent and what is refused."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localchat.backends import GenerationParams
from localchat.backends.inproc import InProcessBackend, load_inproc
from localchat.backends.mlx_options import RuntimeOptions
from localchat.cli.app import app
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession
from localchat.registry import local_dir, resolve

SYSTEM = "You are a helpful assistant."
REMEMBER = "Remember the code harbor 17. Reply only OK."
RECALL = "What was the code? Reply with the code only."
runner = CliRunner()


def reference(model, tokenizer, messages, params: GenerationParams, **kwargs) -> str:
    """What mlx_lm.generate answers for the same prompt, sampler and options (a fresh cache)."""
    import mlx.core as mx
    from mlx_lm import generate
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    if params.seed is not None:
        mx.random.seed(params.seed)
    processors = make_logits_processors(repetition_penalty=params.repetition_penalty)
    return generate(model, tokenizer, prompt, max_tokens=params.max_tokens, logits_processors=processors,
                    sampler=make_sampler(temp=params.temperature, top_p=params.top_p, min_p=params.min_p,
                                         top_k=params.top_k), **kwargs)


def chat(backend, **params) -> ChatSession:
    return ChatSession(backend, Conversation(SYSTEM), GenerationParams(max_tokens=48, **params))


@pytest.mark.parametrize("params", [
    dict(temperature=1.0, top_k=3, seed=7),
    dict(temperature=1.0, min_p=0.3, seed=7),
    dict(temperature=0.8, top_p=0.5, top_k=10, min_p=0.05, seed=3),
    dict(repetition_penalty=3.0),
])
def test_sampling_options_give_what_mlx_lm_gives_in_every_turn(demo, params):
    """The first turn from an empty cache, the next ones reusing it: each equals mlx_lm.generate
    on the whole prompt (the repetition penalty sees the cached tokens too)."""
    model, tokenizer = demo
    session = chat(InProcessBackend(model, tokenizer, "demo"), **params)
    for question in (REMEMBER, "Hello", RECALL):
        result = session.ask(question)
        assert result.text == reference(model, tokenizer, result.messages, session.params)
    assert result.stats.cached_tokens > 0


def test_a_repetition_penalty_changes_a_rambling_reply(rambling_model):
    backend = load_inproc(resolve(str(rambling_model)), rambling_model)
    plain, penalized = chat(backend).ask("hello"), chat(backend, repetition_penalty=5.0).ask("hello")
    assert plain.text != penalized.text


def test_a_quantized_kv_cache_is_mlx_lms_and_keeps_reuse_and_recall(demo):
    model, tokenizer = demo
    options = RuntimeOptions(kv_bits=8, kv_group_size=32, quantized_kv_start=0)
    session = chat(InProcessBackend(model, tokenizer, "demo", options=options))
    first = session.ask(REMEMBER)
    assert first.text == reference(model, tokenizer, first.messages, session.params, kv_bits=8, kv_group_size=32,
                                   quantized_kv_start=0)
    recall = session.ask(RECALL)
    assert recall.text == "harbor 17" and recall.stats.cached_tokens > 0 and not recall.stats.cache_rebuilt
    assert type(session.backend._cache.cache[0]).__name__ == "QuantizedKVCache"


def test_a_rotating_cache_is_rebuilt_from_its_checkpoint_once_it_has_wrapped(demo):
    model, tokenizer = demo
    session = chat(InProcessBackend(model, tokenizer, "demo", options=RuntimeOptions(max_kv_size=64)))
    from localchat.backends.mlx_options import make_cache

    first = session.ask(REMEMBER)
    assert first.text == reference(model, tokenizer, first.messages, session.params,
                                   prompt_cache=make_cache(model, 64))
    assert type(session.backend._cache.cache[0]).__name__ == "RotatingKVCache"
    results = [session.ask(q) for q in ("Hello", "How are you?", "Thanks")]
    assert all(r.committed and not r.stats.cache_rebuilt for r in results)  # each prompt extends the last
    again = session.retry()  # the last answer goes: the cache must lose it, past 64 tokens it cannot be trimmed
    assert again.stats.cache_rebuilt and again.stats.cached_tokens == again.stats.prompt_tokens - 1
    assert again.text == results[-1].text  # from the prompt's checkpoint, greedy gives the same answer


@pytest.fixture(scope="module")
def self_drafted(demo):
    model, tokenizer = demo
    return InProcessBackend(model, tokenizer, "demo", draft_model=model, options=RuntimeOptions(draft_model="demo"))


def test_speculative_decoding_keeps_greedy_output_and_counts_accepted_drafts(demo, self_drafted):
    model, tokenizer = demo
    plain, drafted = chat(InProcessBackend(model, tokenizer, "demo")), chat(self_drafted)
    for question in (REMEMBER, "How are you?", RECALL):
        expected, got = plain.ask(question), drafted.ask(question)
        assert got.text == expected.text  # speculation never changes greedy tokens
        assert got.text == reference(model, tokenizer, got.messages, drafted.params, draft_model=model)
    assert got.text == "harbor 17" and got.stats.cached_tokens > 0
    summary = drafted.ledger.summary()
    assert summary["draft_share"] > 0.5  # a model drafting for itself: most tokens come from the draft


def test_a_draft_model_from_the_registry_loads_and_drafts():
    ref = resolve("demo")
    backend = load_inproc(ref, local_dir(ref), options=RuntimeOptions(draft_model="demo-notes", num_draft_tokens=2))
    result = chat(backend).ask("Hello")
    assert result.committed and result.stats.draft_tokens is not None


def lora_adapter(model_dir, out, scale: float = 20.0):
    """A LoRA adapter as mlx_lm.lora saves one (random, so its effect shows)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model, _ = load(str(model_dir))
    model.freeze()  # as mlx_lm.lora does: only the LoRA layers are trainable, and saved
    parameters = {"rank": 4, "scale": scale, "dropout": 0.0}
    linear_to_lora_layers(model, 3, parameters)
    mx.random.seed(0)
    weights = {name: mx.random.normal(w.shape) * 0.5 for name, w in tree_flatten(model.trainable_parameters())}
    out.mkdir()
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    (out / "adapter_config.json").write_text(json.dumps({"fine_tune_type": "lora", "num_layers": 3,
                                                         "lora_parameters": parameters}))
    return out


def test_a_lora_adapter_is_applied_as_mlx_lm_applies_it(tmp_path):
    from mlx_lm import load

    ref = resolve("demo")
    adapter = lora_adapter(local_dir(ref), tmp_path / "adapter")
    backend = load_inproc(ref, local_dir(ref), options=RuntimeOptions(adapter_path=adapter))
    result = chat(backend).ask(REMEMBER)
    model, tokenizer = load(str(local_dir(ref)), adapter_path=str(adapter))
    assert result.text == reference(model, tokenizer, result.messages, GenerationParams(max_tokens=48))
    assert result.text != "OK"  # the base model's answer: the adapter changed it


@pytest.mark.parametrize("args, said", [
    (["--kv-bits", "7"], "--kv-bits must be one of 2, 3, 4, 5, 6, 8"),
    (["--kv-bits", "4", "--kv-group-size", "64"], "does not divide this model's head dimension (32): use "
                                                  "--kv-group-size 32"),
    (["--max-kv-size", "4"], "at least 8 tokens"),
    (["--draft-model", "demo", "--max-kv-size", "64"], "leave out --max-kv-size"),
    (["--draft-model", "demo", "--kv-bits", "4"], "use one of them"),
    (["--draft-model", "no-such-model"], "no-such-model"),
    (["--draft-model", "smollm2"], "must share the model's tokenizer"),
    (["--adapter-path", "/nonexistent"], "no adapter_config.json"),
    (["--top-k", "-1"], "--top-k"), (["--min-p", "1"], "--min-p"), (["--repetition-penalty", "0"], "--repetition"),
    (["--backend", "server", "--kv-bits", "4"], "set when mlx_lm.server starts"),
    (["--backend", "server", "--max-kv-size", "64"], "in-process only"),
    (["--backend", "server", "--adapter-path", "/tmp"], "needs -m MODEL"),
])
def test_bad_runtime_options_are_one_line(args, said):
    result = runner.invoke(app, ["chat", *args, "Hello"])
    assert result.exit_code in (1, 2), result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and said in errors[0], result.stderr


def test_kv_bits_without_a_group_size_picks_one_that_divides_the_head_dimension_and_says_so():
    result = runner.invoke(app, ["chat", "--kv-bits", "8", "--quantized-kv-start", "0", "Hello"])
    assert result.exit_code == 0, result.stderr
    assert "KV cache 8-bit from 0 tokens, groups of 32 (64 does not divide the head dimension)" in result.stderr
    assert result.stdout.strip()


def test_over_http_the_samplers_and_the_draft_model_are_sent_per_request():
    from localchat.backends.mlx_options import server_fields
    from localchat.backends.openai_http import ServerBackend, sampling_fields

    params = GenerationParams(top_k=40, min_p=0.05, repetition_penalty=1.1)
    assert sampling_fields(params) == {"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1}
    assert sampling_fields(GenerationParams()) == {}  # nothing an OpenAI API would not know
    drafting = RuntimeOptions(draft_model="demo-notes", num_draft_tokens=2)
    fields = server_fields(drafting, "/models/demo", "default_model")
    assert fields == {"draft_model": resolve("demo-notes").location, "num_draft_tokens": 2}
    backend = ServerBackend(None, "/models/demo", extra_fields=fields)
    body = backend.request_body([{"role": "user", "content": "hi"}], params)
    assert body["top_k"] == 40 and body["draft_model"] == fields["draft_model"]
