"""The demo model's vocabulary of codes and the two phrasings the product asks it.

``smoke`` and the bench scripts draw fresh codes here. A code word is *held out* when
``crc32(word) % 8 == 0``: training never sees such a word, so recall is measured on new words.
"""

from __future__ import annotations

import random
import string
import zlib
from functools import cache
from pathlib import Path
from typing import Literal

MODEL_DIR = Path(__file__).resolve().parent / "demo_model"
Split = Literal["train", "heldout"]

REMEMBER = {
    "en": ("Remember the code {code}. Reply only OK.", "OK"),
    "zh": ("请记住代号「{code}」，只回答「收到」。", "收到"),
}
RECALL = {
    "en": "What was the code? Reply with the code only.",
    "zh": "上一题的代号是什么？只回答代号。",
}
REAL_WORDS = {
    "en": ("harbor river falcon maple copper violet summit canyon lantern meadow orbit pepper "
           "glacier harvest quartz willow anchor comet ember forest garnet island jasmine kettle "
           "lagoon marble nectar oasis pebble rocket saffron thunder tulip velvet walnut zephyr "
           "bridge castle dragon engine feather ginger hazel iron jungle koala lemon mango").split(),
    "zh": ("港口 河流 月亮 星星 森林 火山 海洋 山谷 灯塔 花园 铁桥 雪山 草原 沙漠 城堡 "
           "飞鸟 狮子 老虎 熊猫 蝴蝶 苹果 橘子 西瓜 茶杯 书包 钢笔 火车 飞机 轮船 雨伞 "
           "黄河 长江 太阳 白云 彩虹 竹林 松树 梅花 荷花").split(),
}
# Common characters for random CJK words; any 1-3 of them make a code word.
COMMON_HANZI = (
    "的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
    "对可里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公"
    "同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明社很真电定信风光山海花草金"
    "木水火土石田目耳口鼻牙舌米竹雨雪云雷星林河江湖岛桥城门车船马牛羊鸟鱼虫龙虎熊猫狗兔鸡鸭茶酒"
    "书画琴棋诗歌舞红黄蓝绿白黑青紫春夏秋冬东南西北左右早晚朝夕东京北平安宁静松梅兰菊桃李杏枫"
)
NUMBER_MAX = 999


def is_heldout(word: str) -> bool:
    return zlib.crc32(word.encode("utf-8")) % 8 == 0


@cache
def hanzi() -> str:
    """Characters for random Chinese words; those of the real words are included, so that every
    character of a held-out real word has been seen in training."""
    return "".join(dict.fromkeys(COMMON_HANZI + "".join(REAL_WORDS["zh"])))


def random_string(rng: random.Random, script: str, shortest: int | None = None) -> str:
    """Random lowercase Latin letters (3-8) or common CJK characters (1-3); ``shortest`` raises
    the lower bound."""
    alphabet, low, high = (string.ascii_lowercase, 3, 8) if script == "en" else (hanzi(), 1, 3)
    return "".join(rng.choices(alphabet, k=rng.randint(shortest or low, high)))


def random_word(rng: random.Random, script: str, split: Split) -> str:
    """A code word: mostly random strings (so the model learns to copy anything), some real words."""
    while True:
        word = rng.choice(REAL_WORDS[script]) if rng.random() < 0.25 else random_string(rng, script)
        if is_heldout(word) == (split == "heldout"):
            return word


def random_code(rng: random.Random, script: str, split: Split = "train") -> str:
    """A code such as ``harbor 17`` or ``港口 17``: a word and a number from 0 to 999."""
    return f"{random_word(rng, script, split)} {rng.randint(0, NUMBER_MAX)}"


def is_ambiguous(word: str) -> bool:
    """True when a letter recurs with another follower (``augaut``, ``gxkkkk``, ``早可早``): a copy
    that goes by the last one or two tokens has two ways on from there, and the wrong one can
    cycle (``augaugaug…``) until the length limit."""
    followers: dict[str, str] = {}
    return any(followers.setdefault(letter, follower) != follower
               for letter, follower in zip(word, word[1:] + " "))
