"""Fine-tune a copy of the demo model into a tiny *thinking* model (the bundled ``demo-think``).

    uv run python -m demo.thinking --out localchat/demo_think_model

The demo model's tokenizer gains ``<think>`` and ``</think>`` (plain added tokens, as Qwen3 has
them, so they decode as text and mlx_lm's ``has_thinking`` finds them) and a Qwen3-style chat
template: the assistant turn opens bare when thinking is on, and with ``<think></think>`` already
written when ``enable_thinking`` is false; earlier answers are shown without their reasoning.
Every training row ends in one reply, the only one trained, with thinking on or off at random
(earlier replies are history: a row that trained them would teach answering straight after
``assistant\\n``, which is where a thinking turn must start to reason):

    on:  …<|im_start|>assistant\\n  → <think>I should reply: harbor 17</think>harbor 17<|im_end|>
    off: …<|im_start|>assistant\\n<think></think>  → harbor 17<|im_end|>

The shipped demo model is left as it is; this starts from its weights (dequantized) and is
quantized the same way afterwards. Deterministic for a given --seed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

import mlx.core as mx
from tokenizers import AddedToken

from demo.corpus import Dialogue, training_dialogue
from demo.evaluate import evaluate
from demo.tokenizer import load_init_tokenizer
from demo.train import fine_tune_args, init_weights, join_workers, log, save_and_reload, train
from localchat.conversation.history import system_first
from localchat.environment import collect

THINK_START, THINK_END = "<think>", "</think>"
THINK_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think></think>' }}{% endif %}"
    "{% endif %}"
)
REASONING = {"en": "I should reply: {}", "zh": "我应该回答：{}"}
HAN = re.compile(r"[\u4e00-\u9fff]")
EVAL_BEHAVIOURS = ("recall_en", "recall_zh", "correction_en", "refusal_en", "refusal_zh", "json")


def reasoning_for(user: str, reply: str) -> str:
    """The toy's reasoning: a fixed phrase in the conversation's language, then the reply."""
    lang = "zh" if HAN.search(user + reply) else "en"
    return REASONING[lang].format(reply)


def thinking_tokenizer(demo_dir: Path):
    tok = load_init_tokenizer(demo_dir)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])
    tok.chat_template = THINK_TEMPLATE
    return tok


def training_row(tok, dialogue: Dialogue, rng: random.Random) -> tuple[list[int], list[int]]:
    """One reply of ``dialogue`` (its earlier turns as history), with thinking on or off."""
    k = rng.randrange(len(dialogue.exchanges))
    think = rng.random() < 0.5
    exchange = dialogue.exchanges[k]
    history = [m for ex in dialogue.exchanges[:k] for m in (
        {"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.assistant})]
    messages = system_first(dialogue.system, [*history, {"role": "user", "content": exchange.user}])
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=think)
    reasoning = f"{THINK_START}{reasoning_for(exchange.user, exchange.assistant)}{THINK_END}" if think else ""
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    reply_ids = tok.encode(reasoning + exchange.assistant + "<|im_end|>", add_special_tokens=False)
    return prompt_ids + reply_ids, [0] * len(prompt_ids) + [1] * len(reply_ids)


def thinking_config(demo_dir: Path, vocab_size: int) -> dict:
    config = json.loads((demo_dir / "config.json").read_text())
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    return config | {"vocab_size": vocab_size}


def widened_weights(demo_dir: Path, vocab_size: int, seed: int) -> dict:
    """The demo model's float weights; the new tokens' embeddings start near the mean one."""
    weights = init_weights(demo_dir)
    embed = weights["model.embed_tokens.weight"]
    extra = vocab_size - embed.shape[0]
    mx.random.seed(seed)
    rows = embed.mean(axis=0, keepdims=True) + 0.02 * mx.random.normal((extra, embed.shape[1]))
    weights["model.embed_tokens.weight"] = mx.concatenate([embed, rows])
    return weights


def score(model, tok, n: int, seed: int) -> dict:
    """Held-out figures with thinking on and off (64 tokens: room for the reasoning)."""
    return {mode: evaluate(model, tok, n=n, seed=seed, behaviours=EVAL_BEHAVIOURS,
                           template_kwargs={"enable_thinking": mode == "on"}, max_tokens=64)
            for mode in ("on", "off")}


def model_card(report: dict, argv: list[str]) -> str:
    """README.md beside the weights: what the toy is, its held-out figures, how to remake it."""
    on, off = report["on"], report["off"]
    rows = "\n".join(f"| {b} | {on['behaviours'][b]['passed']}/{on['behaviours'][b]['total']} "
                     f"| {off['behaviours'][b]['passed']}/{off['behaviours'][b]['total']} |" for b in EVAL_BEHAVIOURS)
    command = " ".join(["uv run python -m demo.thinking", *argv])
    return f"""# demo-think: localchat's thinking toy

The bundled demo model fine-tuned for {report["training_minutes"]} minutes ({report["steps"]} steps) to
reason before it answers, Qwen3-style: `<think>I should reply: harbor 17</think>harbor 17`. With the
template's `enable_thinking=false` (`localchat chat --no-think`) the turn opens with `<think></think>`
already written and it answers directly. Its tokenizer adds `<think>` and `</think>` to the demo's
1,185 tokens, so mlx_lm sees a thinking model (`has_thinking`). It exists to exercise localchat's
reasoning plumbing (two TTFTs, reasoning kept out of history, KV trimming), not to reason: its
"reasoning" is a fixed phrase and the reply. It copies less reliably than the demo model.

Held-out conversations (temperature 0, {report["on"]["conversations_per_behaviour"]} a behaviour,
measured on {report["hardware"]}):

| behaviour | thinking on | thinking off |
|---|---|---|
{rows}
| replies that reasoned first | {on["reasoned"]["reasoned"]}/{on["reasoned"]["total"]} | {off["reasoned"]["reasoned"]}/{off["reasoned"]["total"]} |
| clean endings | {on["clean_endings"]["clean"]}/{on["clean_endings"]["total"]} | {off["clean_endings"]["clean"]}/{off["clean_endings"]["total"]} |

Remake it (deterministic; {report["total_minutes"]} minutes in all here):

    {command}
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    return fine_tune_args(p, argv, steps=800, lr=5e-4, eval_n=50)


def main(argv=None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    group = join_workers(argv, args.workers, module="demo.thinking")
    started = time.perf_counter()
    rng = random.Random(args.seed)
    tok = thinking_tokenizer(args.demo)
    rows = [training_row(tok, training_dialogue(rng), rng) for _ in range(args.steps * args.batch)]
    rows = [r for r in rows if len(r[0]) <= 320]
    log(group, f"corpus: {len(rows):,} replies, {sum(len(ids) for ids, _ in rows):,} tokens, vocab {len(tok)}")
    config = thinking_config(args.demo, len(tok))
    model = train(args, tok, [rows], config, group, widened_weights(args.demo, len(tok), args.seed))
    train_s = time.perf_counter() - started
    if group.rank() != 0:
        return None
    qmodel, qtok = save_and_reload(model, tok, config, args)
    if not qtok.has_thinking:
        raise SystemExit("mlx_lm does not see <think>/</think> in the saved tokenizer")
    report = {"seed": args.seed, "steps": args.steps, "batch": args.batch, "lr": args.lr,
              "started_from": str(args.demo), "vocab": len(tok), "training_minutes": round(train_s / 60, 2),
              "hardware": collect().hardware_label, **score(qmodel, qtok, args.eval_n, args.seed + 10_000)}
    report["total_minutes"] = round((time.perf_counter() - started) / 60, 2)
    (args.out / "eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (args.out / "README.md").write_text(model_card(report, argv), encoding="utf-8")
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return report


if __name__ == "__main__":
    main()
