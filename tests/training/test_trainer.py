"""The demo model's trainer: its tokenizer, curriculum, planted circuit, losses and a tiny
end-to-end run whose output mlx_lm.server serves. Marked ``training`` (the fast loop skips it)."""

import json
import subprocess
import sys

import httpx
import pytest

from conftest import ROOT
from demo.corpus import JSON_SYSTEM, Dialogue, Exchange
from demo.evaluate import Reply, first_failure
from localchat.server.launch import free_port, launch, wait_ready

pytestmark = pytest.mark.training


def test_loaded_tokenizer_splits_text_as_in_training(demo):
    """mlx_lm.load must give the tokens the model was trained on: the training script's own
    pre-tokenizer (trailing spaces on words, one token per Chinese character, one per digit),
    not one that a tokenizer class substitutes on loading."""
    from demo.corpus import tokenizer_texts
    from demo.tokenizer import build_tokenizer

    _, loaded = demo
    trained = build_tokenizer(tokenizer_texts(), 2048)
    text = "<|im_start|>user\nRemember the code qzxv 907. 请记住代号「港口 17」<|im_end|>\n"
    assert loaded.encode(text, add_special_tokens=False) == trained.encode(text, add_special_tokens=False)
    pieces = [loaded.decode([t]) for t in loaded.encode("the code qzxv 907", add_special_tokens=False)]
    assert pieces[:2] == ["the ", "code "] and pieces[-3:] == ["9", "0", "7"]
    days = "第二章原定周五，现改为周六复习。"
    pieces = [loaded.decode([t]) for t in loaded.encode(days, add_special_tokens=False)]
    assert pieces[4:7] == ["定", "周五", "，"] and "周六" in pieces  # a day name is one token
    assert loaded.encode("周五", add_special_tokens=False) != loaded.encode("周六", add_special_tokens=False)


def test_curriculum_ends_with_corrected_fact_exercises():
    import random

    import demo.train as T
    from demo.corpus import training_dialogue

    stages = T.curriculum(T.parse_args(["--out", "unused", "--steps", "1000"]))
    assert list(stages) == ["copy", "main", "correction"] and sum(stages.values()) == 1000
    rng = random.Random(0)
    share = {stage: sum(training_dialogue(rng, stage).kind.startswith("correction") for _ in range(400)) / 400
             for stage in stages}
    assert share["correction"] > 0.5 > share["main"] > 0.05 and share["copy"] < share["main"]


def test_training_script_runs_end_to_end_and_its_output_is_served(tmp_path):
    out = tmp_path / "tiny"
    run = subprocess.run(
        [sys.executable, "-m", "demo.train", "--out", str(out), "--steps", "4",
         "--batch", "4", "--hidden", "32", "--layers", "2", "--heads", "2", "--intermediate", "64",
         "--eval-n", "1", "--log-every", "2", "--workers", "1", "--embedding-bits", "8"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "step     4/4" in run.stdout and "tok/s" in run.stdout and "ETA" in run.stdout
    report = json.loads((out / "eval.json").read_text())
    assert set(report["behaviours"]) >= {"recall_en", "refusal_zh", "json"}
    assert set(report["stress"]) == {"ambiguous_en", "ambiguous_zh"}
    assert all(s["total"] == 1 and s["clean_endings"]["total"] >= 2 for s in report["stress"].values())
    assert "## Stress test" in (out / "README.md").read_text()

    from mlx_lm import load

    model, tokenizer = load(str(out))
    quantization = json.loads((out / "config.json").read_text())["quantization"]
    assert quantization["bits"] == 4 and quantization["model.embed_tokens"]["bits"] == 8
    assert model.model.embed_tokens.bits == 8 and model.model.layers[0].mlp.up_proj.bits == 4

    server = launch(str(out), port=free_port(), log_path=tmp_path / "server.log")
    try:
        wait_ready(server, timeout_s=120)
        reply = httpx.post(f"{server.base_url}/chat/completions", timeout=30, json={
            "model": str(out), "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
    finally:
        server.stop()
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["role"] == "assistant"


def _planted_model(two_back: bool = True):
    """A model with random weights except the hand-set copy circuit (``two_back=False``: with
    the layer-1 head that matches the token two back silenced)."""
    import mlx.core as mx
    from mlx_lm.models import llama

    import demo.train as T

    config = T.model_config(T.parse_args(["--out", "unused", "--layers", "2"]), 1191, 2)
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    T.plant_induction_circuit(model, config)
    if not two_back:
        o_proj = model.model.layers[1].self_attn.o_proj
        weight = o_proj.weight
        weight[:, config["hidden_size"] // 2:] = 0.0  # only the induction heads write
        o_proj.weight = weight
    return model


def _copy_accuracy(model, words: list[list[int]], rng, only_ambiguous: bool = False) -> float:
    """Teacher-forced: how often the model continues a word it saw once, 200 filler tokens back.
    ``only_ambiguous``: score only the positions whose token recurs in the word with another
    successor while the pair (previous token, token) does not."""
    import mlx.core as mx
    import numpy as np

    def ambiguous(word: list[int], k: int) -> bool:
        successors = {word[j + 1] for j in range(len(word) - 1) if word[j] == word[k]}
        pairs = [j for j in range(1, len(word) - 1) if word[j - 1:j + 1] == word[k - 1:k + 1]]
        return k > 0 and len(successors) > 1 and len(pairs) == 1

    right = total = 0
    for word in words:
        ids = [1, *word, 2, *(rng.randrange(3, 1191) for _ in range(200)), 1, *word]
        predicted = np.array(mx.argmax(model(mx.array([ids]))[0], axis=-1))
        start = len(ids) - len(word)
        for k in range(len(word) - 1):
            if only_ambiguous and not ambiguous(word, k):
                continue
            right += int(predicted[start + k] == word[k + 1])
            total += 1
    return right / total


def test_planted_induction_circuit_copies_unseen_strings_before_any_training():
    """The hand-set circuit alone (random weights elsewhere) continues a random string;
    random weights would be right 1 time in 1,191."""
    import random

    rng = random.Random(1)
    words = [[rng.randrange(3, 1191) for _ in range(8)] for _ in range(10)]
    accuracy = _copy_accuracy(_planted_model(), words, rng)
    assert accuracy >= 0.8, accuracy


def test_planted_two_back_heads_resolve_repeated_tokens():
    """In `rcrelu` the token after `r` is `c` once and `e` once: only the token before it tells
    them apart. Scored at such positions only, matching two tokens copies far better than one."""
    import random

    rng = random.Random(2)
    alphabet = rng.sample(range(3, 1191), 6)
    words = [[rng.choice(alphabet) for _ in range(8)] for _ in range(30)]
    with_two_back = _copy_accuracy(_planted_model(), words, random.Random(3), only_ambiguous=True)
    previous_only = _copy_accuracy(_planted_model(two_back=False), words, random.Random(3), only_ambiguous=True)
    assert with_two_back >= previous_only + 0.25, (with_two_back, previous_only)


def test_stress_words_are_held_out_and_ambiguous_to_copy():
    """The stress test's words recur a letter with another follower, where a copy by the last
    one or two tokens can go two ways; plain words (no such letter) are not picked."""
    import random

    from demo.corpus import heldout_dialogue, is_ambiguous, is_heldout

    assert is_ambiguous("augaut") and is_ambiguous("gxkkkk") and is_ambiguous("早可早")
    assert not is_ambiguous("falcon") and not is_ambiguous("qzxv") and not is_ambiguous("港口")
    rng = random.Random(5)
    for behaviour, script_ok in (("ambiguous_en", str.isascii), ("ambiguous_zh", lambda w: not w.isascii())):
        for _ in range(20):
            dialogue = heldout_dialogue(rng, behaviour)
            word, number = dialogue.exchanges[-1].assistant.split(" ")
            assert is_ambiguous(word) and is_heldout(word) and script_ok(word) and number.isdigit()
            assert word in dialogue.exchanges[0].user


def _replies(*texts):
    return [Reply(text, "stop", 3) for text in texts]


def test_a_failure_names_the_scored_reply_that_was_wrong():
    """A correction exercise can end with an unscored question; the failure is the wrong day."""
    dialogue = Dialogue("correction_en", None, (
        Exchange("Moved from Friday to Saturday. Which day now?", "Saturday"),
        Exchange("Hello!", "Hi!"),
        Exchange("And originally?", "Friday"),
        Exchange("At what time?", "I don't know."),
    ), scored=(0, 2))
    assert first_failure(dialogue, _replies("Saturday", "Hi!", "Friday", "nonsense")) is None
    got = first_failure(dialogue, _replies("Saturday", "Hi!", "Monday", "I don't know."))
    assert got == "'Friday' <- 'Monday'"


def test_a_json_conversation_fails_on_any_reply_that_is_not_answer_json():
    dialogue = Dialogue("json", JSON_SYSTEM, (
        Exchange("Remember the code harbor 17. Reply only OK.", '{"answer": "OK"}'),
        Exchange("What was the code? Reply with the code only.", '{"answer": "harbor 17"}'),
    ), scored=(1,))
    assert first_failure(dialogue, _replies('{"answer": "OK"}', '{"answer": "harbor 17"}')) is None
    got = first_failure(dialogue, _replies("OK", '{"answer": "harbor 17"}'))
    assert got is not None and got.startswith("JSON") and "'OK'" in got


def test_a_derailed_recall_trains_only_the_way_out_of_the_loop():
    """A recovery example's reply starts as a copy gone round in a loop, longer than any code
    word; the loss covers only what ends it there (the JSON's closing `"}`, the end-of-turn token),
    never the loop."""
    import random

    import demo.train as T
    from demo.corpus import recovery_dialogue, tokenizer_texts

    tok = T.build_tokenizer(tokenizer_texts(), 2048)
    rng = random.Random(7)
    for k in range(40):
        as_json = k % 3 == 0
        dialogue = recovery_dialogue(rng, ["en", "zh"][k % 2], as_json=as_json)
        reply = dialogue.exchanges[-1]
        loop = reply.derailed.removeprefix('{"answer": "')
        assert len(loop) > (8 if loop.isascii() else 3) and loop[0] in dialogue.exchanges[0].user
        ids, mask = T.encode_with_mask(tok, dialogue)
        last_turn = max(i for i, t in enumerate(ids) if t == tok.convert_tokens_to_ids("<|im_start|>"))
        start = last_turn + 3  # after "<|im_start|>assistant\n"
        trained = "".join(tok.decode([t]) for t, m in zip(ids[start:], mask[start:]) if m)
        untrained = "".join(tok.decode([t]) for t, m in zip(ids[start:], mask[start:]) if not m)
        assert trained == ('"}' if as_json else "") + "<|im_end|>", trained
        assert untrained == reply.derailed + "\n", untrained


def test_loss_on_trained_positions_has_the_gradients_of_the_plain_loss():
    """`--fast-loss` skips the last MLP and the output layer where nothing is trained; it
    must change nothing else: the same loss and the same gradients, up to float rounding, on
    batches of several widths."""
    import random

    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.models import llama

    import demo.train as T
    from demo.corpus import tokenizer_texts, training_dialogue

    tok = T.build_tokenizer(tokenizer_texts(), 2048)
    rng = random.Random(3)
    rows = [T.encode_with_mask(tok, training_dialogue(rng, "main", recovery=0.2)) for _ in range(24)]
    config = T.model_config(T.parse_args(["--out", "unused"]), len(tok), tok.convert_tokens_to_ids("<|im_end|>"))
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    T.plant_induction_circuit(model, config)
    # as after some training: no two norms alike, no weight exactly zero
    model.update(tree_map(lambda p: p + 0.05 * mx.random.normal(p.shape), model.parameters()))
    for batch in T.make_batches(rows, 8, tok.pad_token_id, rng):
        _assert_same_loss_and_gradients(model, batch)


def _assert_same_loss_and_gradients(model, batch):
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    import demo.train as T

    assert 0 < batch.mask.sum().item() < batch.mask.size / 2  # most positions train nothing
    plain, plain_grads = nn.value_and_grad(model, T.plain_loss)(model, batch.inputs, batch.targets, batch.mask)
    fast, fast_grads = nn.value_and_grad(model, T.loss_on_trained_positions)(
        model, batch.inputs, batch.targets, batch.trained, batch.trained_weights)
    assert abs(plain.item() - fast.item()) < 1e-5
    for (name, a), (_, b) in zip(tree_flatten(plain_grads), tree_flatten(fast_grads)):
        assert mx.abs(a - b).max().item() <= 1e-5 * mx.abs(a).max().item(), name
