"""The demo model's tokenizer: byte-level BPE with ChatML specials, trained on the corpus, and
saved as Hugging Face files that load back as exactly this tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from demo.corpus import DAYS, Dialogue

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# Pre-tokens are single CJK characters, letter runs, single digits and punctuation runs (the last
# three carrying one trailing space), and leftover whitespace. "the code harbor 17." gives "code ",
# "harbor ", "1", "7", so a code tokenizes the same inside a sentence and at the start of a reply;
# every CJK character is one token, never a run of look-alike UTF-8 bytes that copying confuses.
# The exception: each Chinese day name ("周五") is one token, like "Friday", because a two-token
# day starts with "周" whatever the day, and copying its second token then follows the day the
# model said last rather than the one the question asks for.
PRE_TOKEN_PATTERN = "|".join(DAYS["zh"]) + r"|\p{Han}|\p{L}+ ?|\p{N} ?|[^\p{L}\p{N}\s]+ ?|\s+"


def render(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def build_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        model_max_length=1024, clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHATML_TEMPLATE
    return hf


def encode_with_mask(tok: PreTrainedTokenizerFast, dialogue: Dialogue):
    """Token ids of the rendered conversation and a 0/1 mask over what the model is trained to
    say: the assistant replies (+ <|im_end|>) less any derailed start (``Exchange.derailed``).
    A token that straddles a derailed start is trained: it is the one that leaves the loop."""
    messages = dialogue.messages()
    derailed = iter(len(ex.derailed) for ex in dialogue.exchanges)
    text = render(messages)
    spans, pos = [], 0
    for m in messages:
        head = f"<|im_start|>{m['role']}\n"
        start = pos + len(head)
        end = start + len(m["content"]) + len("<|im_end|>")
        if m["role"] == "assistant":
            spans.append((start + next(derailed), end))
        pos = end + 1
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    mask = [int(any(s < b and a < e for s, e in spans)) for a, b in enc["offset_mapping"]]
    return enc["input_ids"], mask


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def save_tokenizer(tok: PreTrainedTokenizerFast, path: Path) -> None:
    """Hugging Face files that load back as exactly this tokenizer (pre-tokenizer included)."""
    for name in TOKENIZER_FILES:
        (path / name).unlink(missing_ok=True)
    tok.save_pretrained(str(path))
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))


def load_init_tokenizer(init: Path) -> PreTrainedTokenizerFast:
    """A warm start keeps the tokenizer its weights were trained with."""
    return PreTrainedTokenizerFast.from_pretrained(str(init))


def check_tokenizer_round_trip(tok: PreTrainedTokenizerFast, loaded) -> None:
    """The model must see at inference exactly the tokens it was trained on."""
    sample = render([{"role": "user", "content": "Remember the code harbor 17. 请记住代号「港口 17」"}])
    if loaded.encode(sample, add_special_tokens=False) != tok.encode(sample, add_special_tokens=False):
        raise SystemExit("the saved tokenizer does not load back identically (check transformers' tokenizer class)")
