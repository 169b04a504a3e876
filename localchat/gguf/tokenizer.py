"""A GGUF file's tokenizer rebuilt with the ``tokenizers`` library, as llama.cpp tokenizes.

GPT-2-style byte-level BPE (``tokenizer.ggml.model == "gpt2"``): the vocabulary and merges from
the file, and the pre-tokenizer llama.cpp picks by ``tokenizer.ggml.pre``. SmolLM's splits every
digit first, then applies GPT-2's regex (transformers' own GGUF conversion does not split digits,
and gives other ids). SentencePiece vocabularies (``"llama"``: Llama 2, Mistral, Gemma's kin):
BPE whose merges follow the pieces' scores, "▁" for spaces and byte fallback, as transformers'
``LlamaConverter`` builds them. Control tokens become special tokens, user-defined ones added tokens.
A vocabulary or pre-tokenizer not listed here is refused: a tokenizer that splits text
differently from the model's training is worse than none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from localchat import bounded_json
from localchat.errors import LocalchatError

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# llama.cpp's pre-tokenizer names → the regexes it splits with, in order, before byte-level BPE
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": (GPT2_SPLIT,), "gpt-2": (GPT2_SPLIT,), "smollm": (r"\p{N}", GPT2_SPLIT),
    "llama-bpe": (LLAMA3_SPLIT,), "llama3": (LLAMA3_SPLIT,), "qwen2": (QWEN2_SPLIT,),
    "deepseek-r1-qwen": (QWEN2_SPLIT,),
}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
MODELS = ("gpt2", "llama")


@dataclass(frozen=True)
class TokenizerSpec:
    """What the GGUF metadata says about its tokenizer."""

    model: str
    pre: str
    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    scores: list[float]
    add_space_prefix: bool
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    unk_id: int | None
    add_bos: bool
    chat_template: str | None
    context_length: int | None


def check_tokenizer(spec: TokenizerSpec) -> None:
    """Refuse, before anything is written, a tokenizer that cannot be rebuilt faithfully."""
    if spec.model not in MODELS:
        raise LocalchatError(f"tokenizer '{spec.model}' cannot be rebuilt (known: {', '.join(MODELS)})")
    if spec.model == "llama":
        if len(spec.scores) != len(spec.tokens):
            raise LocalchatError("the file's SentencePiece vocabulary has no scores for its pieces")
        return
    if spec.pre not in PRE_TOKENIZERS:
        raise LocalchatError(f"pre-tokenizer '{spec.pre}' is unknown here (known: {', '.join(sorted(PRE_TOKENIZERS))})")
    if not spec.merges:
        raise LocalchatError("the file's BPE vocabulary has no merges")


def build_tokenizer(spec: TokenizerSpec) -> Any:
    """A ``transformers.PreTrainedTokenizerFast`` that tokenizes as the GGUF's model expects."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # not "PyTorch was not found"
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    check_tokenizer(spec)
    tok = _sentencepiece_bpe(spec) if spec.model == "llama" else _byte_level_bpe(spec)
    added = [AddedToken(t, special=kind == CONTROL, normalized=False)
             for t, kind in zip(spec.tokens, spec.token_types) if kind in (CONTROL, USER_DEFINED)]
    tok.add_tokens(added)
    name = lambda i: spec.tokens[i] if i is not None and 0 <= i < len(spec.tokens) else None  # noqa: E731
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=name(spec.bos_id), eos_token=name(spec.eos_id),
        pad_token=name(spec.pad_id), unk_token=name(spec.unk_id), clean_up_tokenization_spaces=False,
        model_max_length=spec.context_length or 4096)
    hf.add_bos_token = spec.add_bos
    if spec.chat_template:
        hf.chat_template = spec.chat_template
    return hf


def _byte_level_bpe(spec: TokenizerSpec) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(spec.tokens)}
    merges = [(left, right) for left, _, right in (m.partition(" ") for m in spec.merges)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[spec.pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                   use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def sentencepiece_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges of a SentencePiece vocabulary: every split of a piece into two pieces, the
    merges of higher-scored pieces first (transformers' ``SentencePieceExtractor``)."""
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = []
    for piece, score in zip(tokens, scores):
        local = [(piece[:i], piece[i:]) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab]
        merges += [(left, right, score) for left, right in sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))]
    return [(left, right) for left, right, _ in sorted(merges, key=lambda m: m[2], reverse=True)]


def _sentencepiece_bpe(spec: TokenizerSpec) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {token: i for i, token in enumerate(spec.tokens)}
    unk = spec.tokens[spec.unk_id] if spec.unk_id is not None and 0 <= spec.unk_id < len(spec.tokens) else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=sentencepiece_merges(spec.tokens, spec.scores), unk_token=unk,
                               fuse_unk=True, byte_fallback=BYTE in spec.token_types))
    spaces = normalizers.Replace(" ", "▁")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), spaces]) if spec.add_space_prefix else spaces
    strip = [decoders.Strip(" ", 1, 0)] if spec.add_space_prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    return tok


def save_tokenizer(hf: Any, directory, spec: TokenizerSpec) -> None:
    """Hugging Face files that load back (through mlx_lm) as exactly this tokenizer."""
    import json

    hf.save_pretrained(str(directory))
    path = directory / "tokenizer_config.json"
    config = bounded_json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # never a class that re-splits the text
    config["add_bos_token"] = spec.add_bos
    if spec.chat_template:
        config["chat_template"] = spec.chat_template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
