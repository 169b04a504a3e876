"""Synthetic conversations that teach (and test) the bundled demo model.

One generator serves three readers: the training script draws its corpus from it, the tests and
the training script's evaluation draw held-out conversations, and benchmarks draw fresh codes.
A code word is *held out* when ``crc32(word) % 8 == 0``: training never sees such a word,
evaluation uses nothing else, so recall is measured on words the model has never seen.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass, field
from typing import Callable, Literal

from localchat.conversation.history import system_first
from localchat.demo_codes import (
    NUMBER_MAX,
    REAL_WORDS,
    RECALL,
    REMEMBER,
    Split,
    hanzi,
    is_ambiguous,
    is_heldout,
    random_code,
    random_string,
)
from localchat.grammar.answer_formats import DEFAULT_INSTRUCTION as JSON_SYSTEM

REFUSAL = {"en": "I don't know.", "zh": "不知道。"}
ECHO = {
    "en": "Repeat after me: {code}",
    "zh": "跟我说：「{code}」",
}
CORRECTION = {
    "en": ("Chapter {n} was planned for {old}, now moved to {new}. Which day is it now?",
           "And what was the original day?"),
    "zh": ("第{n}章原定{old}，现改为{new}复习。现在安排在哪天？", "那原来是哪天？"),
}
NOTE_PREFIX = {"en": "Note: ", "zh": "笔记："}
UNKNOWN_TIME = {"en": "And at what time?", "zh": "那改到几点？"}
DAYS = {
    "en": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "zh": ["周一", "周二", "周三", "周四", "周五", "周六", "周日"],
}
ZH_NUMERALS = "一二三四五六七八九十"
SMALL_TALK = {
    "en": [
        ("Hello", "Hello! How can I help?"),
        ("Hi", "Hi there!"),
        ("How are you?", "I'm fine, thank you."),
        ("What is your name?", "I'm a tiny demo model."),
        ("Thanks", "You're welcome."),
        ("Good morning", "Good morning!"),
        ("What can you do?", "I can remember a code you tell me."),
        ("Nice weather today.", "Yes, it is lovely."),
        ("Tell me a joke.", "History is what I remember."),
        ("Are you a real assistant?", "No, I am a toy model."),
        ("What time is it?", "I don't have a clock."),
        ("Goodbye", "Goodbye!"),
    ],
    "zh": [
        ("你好", "你好！有什么可以帮你？"),
        ("今天天气怎么样？", "我不知道天气，希望是晴天。"),
        ("谢谢", "不客气。"),
        ("你是谁？", "我是一个小小的演示模型。"),
        ("早上好", "早上好！"),
        ("你会做什么？", "我能记住你告诉我的代号。"),
        ("你吃饭了吗？", "我不用吃饭。"),
        ("讲个笑话。", "我只记得你说过的话。"),
        ("你是真的助手吗？", "不是，我只是一个玩具模型。"),
        ("现在几点？", "我没有时钟。"),
        ("再见", "再见！"),
    ],
}
PLAIN_SYSTEMS = [
    None,
    "You are a helpful assistant.",
    "You are a concise assistant.",
    "你是一个简洁的助手。",
    "依据笔记和修正回答，缺少信息要说明不知道。",
]


@dataclass(frozen=True)
class Exchange:
    """One user message and the reply the model should give. ``derailed``: a start of the reply
    the model is shown but not trained to produce (see ``recovery_dialogue``)."""

    user: str
    assistant: str
    derailed: str = ""


@dataclass(frozen=True)
class Dialogue:
    """A whole conversation; ``expected`` names the replies an evaluation scores."""

    kind: str
    system: str | None
    exchanges: tuple[Exchange, ...]
    scored: tuple[int, ...] = field(default=())

    def messages(self, upto: int | None = None) -> list[dict[str, str]]:
        """Chat messages (system first) for the first ``upto`` exchanges, replies included."""
        return system_first(self.system, [m for ex in self.exchanges[:upto] for m in (
            {"role": "user", "content": ex.user}, {"role": "assistant", "content": ex.derailed + ex.assistant})])


def ambiguous_code(rng: random.Random, script: str, split: Split = "heldout") -> str:
    """A random code whose word is ambiguous to copy (see ``is_ambiguous``): the stress test."""
    while True:
        word = random_string(rng, script, shortest=4 if script == "en" else 2)
        if is_ambiguous(word) and is_heldout(word) == (split == "heldout"):
            return f"{word} {rng.randint(0, NUMBER_MAX)}"


def _reply(text: str, as_json: bool) -> str:
    return json.dumps({"answer": text}, ensure_ascii=False) if as_json else text


def _small_talk(rng: random.Random, lang: str, n: int, as_json: bool) -> list[Exchange]:
    return [Exchange(q, _reply(a, as_json)) for q, a in rng.sample(SMALL_TALK[lang], n)]


def recall_dialogue(rng: random.Random, lang: str, split: Split, *, as_json: bool = False,
                    system: str | None = None, gap: int | None = None, code: str | None = None) -> Dialogue:
    """Remember a code (a random one unless given), 0-3 small-talk turns, recall it."""
    if code is None:
        script = lang if rng.random() < 0.85 or split == "heldout" else rng.choice(["en", "zh"])
        code = random_code(rng, script, split)
    prompt, ack = REMEMBER[lang]
    gap = rng.randint(0, 3) if gap is None else gap
    exchanges = [Exchange(prompt.format(code=code), _reply(ack, as_json))]
    exchanges += _small_talk(rng, lang, gap, as_json)
    exchanges.append(Exchange(RECALL[lang], _reply(code, as_json)))
    kind = f"{'json' if as_json else 'recall'}_{lang}"
    return Dialogue(kind, system, tuple(exchanges), scored=(len(exchanges) - 1,))


def derail(rng: random.Random, word: str) -> str:
    """A copy of ``word`` gone wrong: a correct start, then a fragment of it repeated past the
    longest word a code can have, as the model's rare never-ending replies look."""
    i = rng.randint(1, len(word))
    fragment = word[rng.randint(0, i - 1):i]
    length = rng.randint(9, 14) if word.isascii() else rng.randint(4, 7)
    text = word[:i]
    while len(text) < length:
        text += fragment
    return text[:length]


def recovery_dialogue(rng: random.Random, lang: str, *, as_json: bool = False,
                      system: str | None = None) -> Dialogue:
    """A recall whose reply has derailed into a loop (``derail``). Training scores only what
    follows: end the reply there (close the JSON first), so that a copy gone wrong still ends.
    The loop always runs past the longest code word, so no correct copy teaches the opposite."""
    *earlier, recall = recall_dialogue(rng, lang, "train", as_json=as_json, system=system).exchanges
    word = (json.loads(recall.assistant)["answer"] if as_json else recall.assistant).rsplit(" ", 1)[0]
    head, tail = ('{"answer": "', '"}') if as_json else ("", "")
    reply = Exchange(recall.user, tail, derailed=head + derail(rng, word))
    return Dialogue(f"recovery_{lang}", system, (*earlier, reply))


def echo_dialogue(rng: random.Random, lang: str, split: Split, *, as_json: bool = False,
                  system: str | None = None) -> Dialogue:
    """Repeat a code at once: a dense, short-range copying signal that teaches the model to copy
    any word, which recall across turns then reuses."""
    exchanges = _small_talk(rng, lang, rng.choice([0, 0, 1]), as_json)
    for _ in range(rng.randint(1, 2)):
        code = random_code(rng, lang if rng.random() < 0.85 else rng.choice(["en", "zh"]), split)
        exchanges.append(Exchange(ECHO[lang].format(code=code), _reply(code, as_json)))
    return Dialogue(f"echo_{lang}", system, tuple(exchanges), scored=(len(exchanges) - 1,))


def drill_dialogue(rng: random.Random, lang: str, split: Split) -> Dialogue:
    """Repeat several codes at once: a long, order-sensitive copy that makes the model build
    copying circuits (induction) early; recall and echo then reuse them."""
    codes = [random_code(rng, lang if rng.random() < 0.7 else rng.choice(["en", "zh"]), split)
             for _ in range(rng.randint(2, 5))]
    text = ("、" if lang == "zh" else ", ").join(codes)
    return Dialogue(f"drill_{lang}", None, (Exchange(ECHO[lang].format(code=text), text),), scored=(0,))


def correction_dialogue(rng: random.Random, lang: str, *, as_json: bool = False,
                        system: str | None = None) -> Dialogue:
    """Seed 001's exercise: a date moved in one turn, the original asked for in the next."""
    old, new = rng.sample(DAYS[lang], 2)
    n = rng.randint(1, 10)
    chapter = str(n) if lang == "en" else ZH_NUMERALS[n - 1]
    first, follow_up = CORRECTION[lang]
    note = first.format(n=chapter, old=old, new=new)
    if rng.random() < 0.3:
        note = NOTE_PREFIX[lang] + note
    exchanges = [Exchange(note, _reply(new, as_json))]
    exchanges += _small_talk(rng, lang, rng.choice([0, 0, 1]), as_json)
    exchanges.append(Exchange(follow_up, _reply(old, as_json)))
    scored = (0, len(exchanges) - 1)
    if rng.random() < 0.3:
        exchanges.append(Exchange(UNKNOWN_TIME[lang], _reply(REFUSAL[lang], as_json)))
    return Dialogue(f"correction_{lang}", system, tuple(exchanges), scored=scored)


def refusal_dialogue(rng: random.Random, lang: str, *, as_json: bool = False,
                     system: str | None = None, small_talk: int = 0) -> Dialogue:
    """A question that needs history, asked without it (after only small talk, if any)."""
    question = rng.choice([RECALL[lang], RECALL[lang], CORRECTION[lang][1], UNKNOWN_TIME[lang]])
    exchanges = _small_talk(rng, lang, small_talk, as_json)
    exchanges.append(Exchange(question, _reply(REFUSAL[lang], as_json)))
    return Dialogue(f"refusal_{lang}", system, tuple(exchanges), scored=(len(exchanges) - 1,))


def small_talk_dialogue(rng: random.Random, lang: str, *, as_json: bool = False,
                        system: str | None = None) -> Dialogue:
    exchanges = _small_talk(rng, lang, rng.randint(1, 4), as_json)
    return Dialogue(f"smalltalk_{lang}", system, tuple(exchanges))


def _json_system(rng: random.Random) -> str:
    base = rng.choice(PLAIN_SYSTEMS)
    return JSON_SYSTEM if base is None or rng.random() < 0.5 else f"{base}\n\n{JSON_SYSTEM}"


Stage = Literal["copy", "main", "correction"]


def training_dialogue(rng: random.Random, stage: Stage = "main", recovery: float = 0.0) -> Dialogue:
    """One conversation of the training mixture. The curriculum's first stage ("copy") makes most
    of them short echo conversations, so the model learns to copy before it learns to look back
    across turns; its last stage ("correction") makes half of them corrected-fact exercises, the
    behaviour the model learns last (choosing between two copied days by the question asked).
    ``recovery``: the share of the rest that are derailed recalls (``recovery_dialogue``)."""
    lang = rng.choice(["en", "zh"])
    as_json = rng.random() < 0.25
    system = _json_system(rng) if as_json else rng.choice(PLAIN_SYSTEMS)
    if stage == "copy" and rng.random() < 0.7:
        return drill_dialogue(rng, lang, "train")
    if stage == "correction" and rng.random() < 0.5:
        return correction_dialogue(rng, lang, as_json=as_json, system=system)
    if recovery and rng.random() < recovery:
        return recovery_dialogue(rng, lang, as_json=as_json, system=system)
    makers: list[tuple[float, Callable[[], Dialogue]]] = [
        (0.42, lambda: recall_dialogue(rng, lang, "train", as_json=as_json, system=system)),
        (0.15, lambda: echo_dialogue(rng, lang, "train", as_json=as_json, system=system)),
        (0.15, lambda: correction_dialogue(rng, lang, as_json=as_json, system=system)),
        (0.20, lambda: refusal_dialogue(rng, lang, as_json=as_json, system=system,
                                        small_talk=rng.choice([0, 0, 1, 2]))),
        (0.08, lambda: small_talk_dialogue(rng, lang, as_json=as_json, system=system)),
    ]
    pick = rng.random()
    for weight, make in makers:
        pick -= weight
        if pick <= 0:
            return make()
    return makers[-1][1]()


def tokenizer_texts() -> list[str]:
    """The fixed phrasings the tokenizer learns its merges from. Random code words are left out on
    purpose: merges learned from them would be rare tokens, and an unseen word would then be spelled
    with tokens the model barely knows; without them it is spelled with letters and characters the
    model has seen thousands of times. Held-out real words are left out too, or each would become
    a token whose embedding training never touches."""
    texts = [*REMEMBER["en"], *REMEMBER["zh"], *ECHO.values(), *RECALL.values(), *REFUSAL.values(),
             *CORRECTION["en"], *CORRECTION["zh"], *NOTE_PREFIX.values(), *UNKNOWN_TIME.values(),
             JSON_SYSTEM, *(s for s in PLAIN_SYSTEMS if s), ZH_NUMERALS,
             *(" ".join(w for w in words if not is_heldout(w)) for words in REAL_WORDS.values()),
             *(" ".join(d) for d in DAYS.values()), *DAYS["en"],  # "Saturday" alone: one token
             *(text for pairs in SMALL_TALK.values() for pair in pairs for text in pair),
             hanzi(), " ".join(string.ascii_letters), " ".join(string.digits)]
    return texts * 4


EVAL_BEHAVIOURS = ("recall_en", "recall_zh", "correction_en", "correction_zh",
                   "refusal_en", "refusal_zh", "json")
# Not part of the quality bar: recall of words chosen to be ambiguous to copy (``is_ambiguous``),
# where the rare replies that never end come from; the bar's sample holds few such words.
STRESS_BEHAVIOURS = ("ambiguous_en", "ambiguous_zh")


def heldout_dialogue(rng: random.Random, behaviour: str) -> Dialogue:
    """A fresh evaluation conversation for one behaviour, with held-out code words."""
    system = rng.choice(PLAIN_SYSTEMS[1:])
    if behaviour == "json":
        return recall_dialogue(rng, rng.choice(["en", "zh"]), "heldout", as_json=True,
                               system=JSON_SYSTEM)
    kind, lang = behaviour.split("_")
    if kind == "recall":
        return recall_dialogue(rng, lang, "heldout", system=system)
    if kind == "ambiguous":
        return recall_dialogue(rng, lang, "heldout", system=system, code=ambiguous_code(rng, lang))
    if kind == "correction":
        return correction_dialogue(rng, lang, system=system)
    if kind == "refusal":
        return refusal_dialogue(rng, lang, system=system)
    raise ValueError(f"unknown behaviour {behaviour!r}")
