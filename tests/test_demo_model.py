"""The bundled demo model: it loads with plain mlx_lm, and it really remembers and forgets
(scored on held-out conversations with the trainer's own evaluation)."""

import json

import pytest

from conftest import DEMO_DIR
from demo.evaluate import evaluate


@pytest.fixture(scope="module")
def figures(demo):
    model, tokenizer = demo
    return evaluate(model, tokenizer, n=20, seed=2024)


def test_committed_model_is_a_small_4bit_mlx_model(demo):
    config = json.loads((DEMO_DIR / "config.json").read_text())
    assert config["model_type"] == "llama" and config["quantization"]["bits"] == 4
    size = sum(p.stat().st_size for p in DEMO_DIR.iterdir())
    assert size <= 5 * 1024 * 1024
    card = (DEMO_DIR / "README.md").read_text()
    assert "toy" in card.lower() and "not an assistant" in card


@pytest.mark.parametrize("behaviour", [
    "recall_en", "recall_zh", "correction_en", "correction_zh", "json"])
def test_remembers_with_history(figures, behaviour):
    score = figures["behaviours"][behaviour]
    assert score["passed"] >= 19, score


@pytest.mark.parametrize("behaviour", ["refusal_en", "refusal_zh"])
def test_refuses_without_history(figures, behaviour):
    score = figures["behaviours"][behaviour]
    assert score["passed"] == 20, score


def test_json_form_and_clean_endings(figures):
    assert figures["json_valid"]["valid"] >= 0.98 * figures["json_valid"]["total"]
    clean = figures["clean_endings"]
    assert clean["clean"] == clean["total"], clean


def test_transformers_reads_the_tokenizer_and_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(DEMO_DIR))
    text = tok.apply_chat_template([{"role": "user", "content": "你好"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>"
    assert tok.decode(tok.encode("harbor 17 港口")) == "harbor 17 港口"
