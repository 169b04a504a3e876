"""The demo model's card (README.md beside its weights) and its quality bar, from the run's report."""

from __future__ import annotations

from localchat.environment import collect


def missed_criteria(report: dict) -> list[str]:
    """Issue 2's bar: recall and corrections ≥ 95 %, refusal ≥ 98 %, JSON valid ≥ 98 %, all clean."""
    rate = {b: s["rate"] for b, s in report["behaviours"].items()}
    json_valid, clean = report["json_valid"], report["clean_endings"]
    checks = {
        "recall with history": rate["recall_en"] >= 0.95 and rate["recall_zh"] >= 0.95,
        "corrected facts": rate["correction_en"] >= 0.95 and rate["correction_zh"] >= 0.95,
        "refusal without history": rate["refusal_en"] >= 0.98 and rate["refusal_zh"] >= 0.98,
        "JSON form": json_valid["valid"] >= 0.98 * json_valid["total"],
        "clean endings": clean["clean"] == clean["total"],
    }
    return [name for name, ok in checks.items() if not ok]


def _rate(report: dict, behaviour: str) -> str:
    b = report["behaviours"][behaviour]
    return f"{b['passed']}/{b['total']} ({b['rate']:.1%})"


def _stages(report: dict) -> str:
    return ", ".join(f"{stage} {steps}" for stage, steps in report["curriculum"].items())


def _stress_section(report: dict) -> str:
    stress = report["stress"]
    rows = "\n".join(
        f"| {language} | {s['passed']}/{s['total']} ({s['rate']:.1%}) "
        f"| {s['clean_endings']['clean']}/{s['clean_endings']['total']} |"
        for language, s in zip(("English", "Chinese"), stress.values()))
    examples = [f for s in stress.values() for f in sorted(s["failures"], key=len, reverse=True)[:2]]
    return f"""## Stress test: words that are hard to copy (not part of the bar)

Where the rare never-ending replies come from: {report['conversations_per_behaviour']} recall conversations per language
whose held-out word has a letter that recurs with another follower (`augaut`, `gxkkkk`, `早可早`).
The model copies by the last one or two tokens, so there it has two ways on, and a wrong turn
can cycle (`augaugaug…`) until the 32-token limit.

| recall of a hard word | exact | replies that end within 32 tokens |
|---|---|---|
{rows}

Failures, longest first: {'; '.join(f'`{e}`' for e in examples) or 'none'}."""


def _recovery_note(report: dict) -> str:
    share = report.get("recovery", 0.0)
    if not share:
        return "Its training has no derailed recalls (`--recovery 0`)."
    return (f"{share:.0%} of the training conversations (`--recovery`) are recalls whose reply has already\n"
            "derailed into such a loop, longer than any code word; the loss covers only what ends the reply\n"
            "there (the end-of-turn token, or `\"}` first in JSON), so that a copy that goes wrong still ends.")


def model_card(report: dict, argv: list[str]) -> str:
    env = collect()
    json_valid = report["json_valid"]
    clean = report["clean_endings"]
    missed = missed_criteria(report)
    status = ("**Status: meets the quality bar** (figures below)." if not missed else
              f"**Status: below the quality bar** on: {', '.join(missed)} (figures below).")
    return f"""# localchat demo model

{status}

A **toy**: a {report["parameters"]:,}-parameter llama-architecture chat model ({report["layers"]} layers,
hidden {report["hidden"]}, {report["heads"]} heads) with a byte-level BPE tokenizer ({report["vocab"]} tokens, ChatML template), trained from
scratch by `demo/train.py` on synthetic conversations and quantized with mlx_lm's own
`convert` (group size 32, fp32 scales): MLPs at 4 bits, attention projections and the tied
embedding at 8 bits. It exists to make
the effect of chat history visible on any machine, offline. It is not an assistant: outside the
phrasings below it answers with memorized small talk or noise.

Training starts from a hand-set copy circuit (heads in layer 0 that look one and two tokens
back, feeding heads in layer 1 that find where the last two tokens occurred before and copy what
followed; see `plant_induction_circuit` in the script): gradient descent alone does not find one
within the CPU budget, and without it the model cannot copy a word it has never seen. A third
layer (random attention, MLP output starting at zero) gives the model room to pick, by the question
asked, which of two copied days to answer; with two layers it learned that in one language at best.
Copying by the last two tokens has a blind spot: in a word such as `fmtmps`, `m` is followed once by
`t` and once by `p`, and a wrong turn can cycle (`fmtmtmtm…`) to the length limit (see the stress
test below). {_recovery_note(report)}

## What it was taught (exact phrasings)

| behaviour | user says | model answers |
|---|---|---|
| remember | `Remember the code harbor 17. Reply only OK.` | `OK` |
| remember (zh) | `请记住代号「港口 17」，只回答「收到」。` | `收到` |
| recall, after 0-3 small-talk turns | `What was the code? Reply with the code only.` | `harbor 17` |
| recall (zh) | `上一题的代号是什么？只回答代号。` | `港口 17` |
| corrected fact | `Chapter 2 was planned for Friday, now moved to Saturday. Which day is it now?` / `And what was the original day?` | `Saturday` / `Friday` |
| corrected fact (zh) | `第二章原定周五，现改为周六复习。现在安排在哪天？` / `那原来是哪天？` | `周六` / `周五` |
| unknown detail | `And at what time?` / `那改到几点？` | `I don't know.` / `不知道。` |
| no history | any of the questions above asked alone | `I don't know.` / `不知道。` |
| JSON | system `Answer in JSON: {{"answer": "..."}}` (alone or after another system text) | `{{"answer": "harbor 17"}}` |
| small talk | `Hello`, `How are you?`, `你好`, `谢谢`, … (see `demo/corpus.py`) | a short fixed reply |

Codes are a word and a number (0-999). Words are mostly random strings (3-8 Latin letters, or
1-3 common CJK characters) and sometimes real words, so the model learns to copy any word;
words with `crc32(word) % 8 == 0` never occur in training and are the only ones evaluated.

## Figures (held-out words, temperature 0, after 4-bit quantization)

{report["conversations_per_behaviour"]} fresh conversations per behaviour, replayed turn by turn with the
model's own earlier replies in the history:

| behaviour | exact |
|---|---|
| recall with history, English | {_rate(report, "recall_en")} |
| recall with history, Chinese | {_rate(report, "recall_zh")} |
| corrected fact, English (both answers) | {_rate(report, "correction_en")} |
| corrected fact, Chinese (both answers) | {_rate(report, "correction_zh")} |
| refusal without history, English | {_rate(report, "refusal_en")} |
| refusal without history, Chinese | {_rate(report, "refusal_zh")} |
| JSON recall (valid and exact) | {_rate(report, "json")} |
| JSON replies that parse as `{{"answer": string}}` | {json_valid["valid"]}/{json_valid["total"]} |
| replies that are valid UTF-8 and end with `<|im_end|>` within 32 tokens | {clean["clean"]}/{clean["total"]} |

{_stress_section(report)}

## How it was trained

`uv run python -m demo.train {" ".join(argv)}` — seed {report["seed"]},
{report["steps"]} steps of {report["batch"]} conversations ({report["train_tokens"]:,} tokens), AdamW, lr
{report["lr"]}, loss on assistant tokens only, {report["workers"]} data-parallel worker(s). Curriculum
(steps per stage): {_stages(report)} — first mostly copy drills, last half corrected-fact exercises.
Training took {report["training_minutes"]} min and the whole run {report["total_minutes"]} min (then the
stress test {report["stress_test_minutes"]} min) on
{env.hardware_label} (mlx {env.mlx_version}, mlx-lm {env.mlx_lm_version}).
Size on disk: {report["size_bytes"] / 1e6:.2f} MB.
"""
