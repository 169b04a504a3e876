"""Fine-tune the demo model to keep notes: summarize a conversation when asked, and answer from notes
placed after the system message (what ``/compact`` writes and what ``/pin`` keeps).

    uv run python -m demo.notes --out /tmp/notes-1 --keep-float /tmp/notes-1-float
    uv run python -m demo.notes --demo /tmp/notes-1-float --out localchat/demo_notes_model \\
        --steps 250 --lr 1e-4 --seed 1

    user:      Summarize the conversation so far as notes.     (把目前为止的对话总结成笔记。)
    assistant: Note: the code harbor 17.                       (笔记：代号「港口 17」。)
    system:    You are a helpful assistant.\n\nNote: the code harbor 17.
    user:      What was the code? Reply with the code only.  →  harbor 17

The notes keep the codes told, worded as the request to remember them was ("the code harbor 17",
"代号「港口 17」"), so the copy circuit that recalls a code from history finds it in the notes too;
they read as localchat writes pins (``conversation.history.pin_note``). A summary that already
stands in the system message is carried into the new one, so compaction can update it. Recalls across
many small-talk turns (4-14, the long conversations of ``bench --policy``) join the mixture, and 70 %
of it stays the demo model's own training mixture, so most of its card figures hold (its card says
which moved). It starts from the shipped model's weights (dequantized), keeps its tokenizer and is
quantized the same way after.
Deterministic for a given --seed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from demo.corpus import (
    CORRECTION,
    DAYS,
    PLAIN_SYSTEMS,
    RECALL,
    REFUSAL,
    REMEMBER,
    UNKNOWN_TIME,
    ZH_NUMERALS,
    Dialogue,
    Exchange,
    _small_talk,
    training_dialogue,
)
from demo.evaluate import first_failure, replay
from demo.sibling import card_table_rows, fine_tune, write_report
from demo.tokenizer import encode_with_mask, load_init_tokenizer
from demo.train import fine_tune_args, join_workers, log
from localchat.conversation.compaction import SUMMARY_PROMPT
from localchat.conversation.history import NOTE_PREFIX
from localchat.demo_codes import MODEL_DIR, random_code

CODE_NOTE = {"en": "the code {code}.", "zh": "代号「{code}」。"}
NOTHING = {"en": "Note: nothing to remember.", "zh": "笔记：没有要记的。"}
MAX_ROW_TOKENS = 400
REMAKE = ("uv run python -m demo.notes --out /tmp/notes-1 --keep-float /tmp/notes-1-float\n    "
          "uv run python -m demo.notes --demo /tmp/notes-1-float --out localchat/demo_notes_model "
          "--steps 250 --lr 1e-4 --seed 1")
NOTE_BEHAVIOURS = ("summary_en", "summary_zh", "notes_recall_en", "notes_recall_zh", "long_recall_en",
                   "long_recall_zh")


def notes_text(lang: str, code: str | None) -> str:
    """``Note: the code harbor 17.`` (``Note: nothing to remember.`` without a code)."""
    return NOTE_PREFIX[lang] + CODE_NOTE[lang].format(code=code) if code else NOTHING[lang]


def correction(rng: random.Random, lang: str) -> tuple[list[Exchange], tuple[str, str, str]]:
    """A day moved, and the follow-up question about the original day."""
    old, new = rng.sample(DAYS[lang], 2)
    n = rng.randint(1, 10)
    chapter = str(n) if lang == "en" else ZH_NUMERALS[n - 1]
    first, follow_up = CORRECTION[lang]
    return [Exchange(first.format(n=chapter, old=old, new=new), new), Exchange(follow_up, old)], (chapter, old, new)


def _system(rng: random.Random, notes: list[str]) -> str | None:
    base = rng.choice(PLAIN_SYSTEMS[:4])
    return "\n\n".join([*([base] if base else []), *notes]) or None


def long_recall_dialogue(rng: random.Random, lang: str, split: str) -> Dialogue:
    """Remember a code, 4-14 small-talk turns, perhaps a moved day, then recall the code."""
    code = random_code(rng, lang, split)
    prompt, ack = REMEMBER[lang]
    exchanges = [Exchange(prompt.format(code=code), ack), *_small_talk_many(rng, lang, rng.randint(4, 14))]
    if rng.random() < 0.5:
        exchanges += correction(rng, lang)[0]
    exchanges.append(Exchange(RECALL[lang], code))
    return Dialogue(f"long_recall_{lang}", _system(rng, []), tuple(exchanges), scored=(len(exchanges) - 1,))


def _small_talk_many(rng: random.Random, lang: str, n: int) -> list[Exchange]:
    """``n`` small-talk turns (the list is shorter than 16: drawn in rounds)."""
    turns: list[Exchange] = []
    while len(turns) < n:
        turns += _small_talk(rng, lang, min(n - len(turns), 8), False)
    return turns


def summary_dialogue(rng: random.Random, lang: str, split: str) -> Dialogue:
    """Turns (and perhaps earlier notes in the system message) summarized on request."""
    code = random_code(rng, lang, split) if rng.random() < 0.85 else None
    noted = code is not None and rng.random() < 0.4  # the code is already in the notes
    exchanges = [] if noted or code is None else [Exchange(REMEMBER[lang][0].format(code=code), REMEMBER[lang][1])]
    exchanges += _small_talk_many(rng, lang, rng.randint(0, 6))
    if rng.random() < 0.4:
        exchanges += correction(rng, lang)[0][:rng.randint(1, 2)]
    exchanges += _small_talk_many(rng, lang, rng.randint(0, 2))
    earlier = [notes_text(lang, code)] if noted else []
    exchanges.append(Exchange(SUMMARY_PROMPT[lang], notes_text(lang, code)))
    return Dialogue(f"summary_{lang}", _system(rng, earlier), tuple(exchanges), scored=(len(exchanges) - 1,))


def notes_recall_dialogue(rng: random.Random, lang: str, split: str) -> Dialogue:
    """Notes in the system message (a summary or a pin), some turns (perhaps a day moved), then a
    question the notes answer, or one about a detail nobody gave."""
    code = random_code(rng, lang, split)
    system = _system(rng, [notes_text(lang, code)])
    exchanges = _small_talk_many(rng, lang, rng.randint(0, 4))
    if rng.random() < 0.4:
        exchanges += correction(rng, lang)[0]
    exchanges.append(Exchange(RECALL[lang], code) if rng.random() < 0.8 else
                     Exchange(UNKNOWN_TIME[lang], REFUSAL[lang]))
    return Dialogue(f"notes_recall_{lang}", system, tuple(exchanges), scored=(len(exchanges) - 1,))


MAKERS = {"summary": summary_dialogue, "notes_recall": notes_recall_dialogue, "long_recall": long_recall_dialogue}


def notes_training_dialogue(rng: random.Random, share: float) -> Dialogue:
    """``share`` of the rows teach notes (summaries, answers from notes, long recalls); the rest
    is the demo model's own mixture, so that what it could do stays."""
    if rng.random() >= share:
        return training_dialogue(rng, "main", recovery=0.04)
    kind = rng.choices(list(MAKERS), weights=[0.5, 0.3, 0.2])[0]
    return MAKERS[kind](rng, rng.choice(["en", "zh"]), "train")


def evaluate_notes(model, tok, n: int, seed: int) -> dict:
    """Held-out figures of the new behaviours (exact replies, words never seen in training)."""
    rng = random.Random(seed)
    figures = {}
    for behaviour in NOTE_BEHAVIOURS:
        kind, lang = behaviour.rsplit("_", 1)
        passed, failures = 0, []
        for _ in range(n):
            dialogue = MAKERS[kind](rng, lang, "heldout")
            failure = first_failure(dialogue, replay(model, tok, dialogue, max_tokens=48))
            passed += failure is None
            if failure and len(failures) < 5:
                failures.append(failure)
        figures[behaviour] = {"passed": passed, "total": n, "rate": round(passed / n, 4), "failures": failures}
    return figures


def model_card(report: dict, card: dict) -> str:
    """README.md beside the weights: the demo's card figures before and after, and the notes figures."""
    rows = card_table_rows(report, card, {b: report["notes"][b] for b in NOTE_BEHAVIOURS})
    moved = ", ".join(report["card_figures_moved"]) or "none"
    weak = ", ".join(b for b in NOTE_BEHAVIOURS if report["notes"][b]["rate"] < 0.5) or "none"
    return f"""# demo-notes: the demo model, taught to keep notes

The bundled demo model fine-tuned ({report['notes_fine_tune']['steps']} steps of the last stage) to
write notes of a conversation when asked (`{SUMMARY_PROMPT['en']}` → `Note: the code harbor 17.`,
`{SUMMARY_PROMPT['zh']}` → `笔记：代号「港口 17」。`) and to answer from notes after the system message
(what `/compact` writes and `/pin` keeps). Everything else is the demo model's (its card:
`localchat/demo_model/README.md`).

It ships beside the demo, not in it: the card's figures that moved by more than one point: {moved}.
Notes behaviours right less than half the time: {weak} (a summary in Chinese mostly miscopies the
code's first character, so Chinese compaction loses the fact; pinned notes still answer).

Held-out conversations, temperature 0, measured on {report['hardware']}:

| behaviour | demo | demo-notes |
|---|---|---|
{chr(10).join(rows)}

Remake it (deterministic for the seeds; ~40 minutes here in all):

    {REMAKE}
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--share", type=float, default=0.3, help="share of the rows that teach notes")
    p.add_argument("--notes-n", type=int, default=100, help="held-out conversations per notes behaviour")
    return fine_tune_args(p, argv, steps=600, lr=3e-4, eval_n=200)


def main(argv=None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    group = join_workers(argv, args.workers, module="demo.notes")
    started = time.perf_counter()
    before = json.loads((MODEL_DIR / "eval.json").read_text())  # the shipped demo's card
    rng = random.Random(args.seed)
    tok = load_init_tokenizer(args.demo)
    rows = [encode_with_mask(tok, notes_training_dialogue(rng, args.share)) for _ in range(args.steps * args.batch)]
    rows = [r for r in rows if len(r[0]) <= MAX_ROW_TOKENS]
    log(group, f"corpus: {len(rows):,} conversations, {sum(len(ids) for ids, _ in rows):,} tokens")
    trained = fine_tune(args, tok, rows, group)
    if trained is None:
        return None
    qmodel, qtok = trained
    train_s = time.perf_counter() - started
    notes = evaluate_notes(qmodel, qtok, n=args.notes_n, seed=args.seed + 30_000)
    return write_report(args, qmodel, qtok, kind="notes", before=before, own={"notes": notes}, started=started,
                        train_s=train_s, card=model_card)


if __name__ == "__main__":
    main()
