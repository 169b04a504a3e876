"""Model families for tests: each a real chat template (``tests/templates``) on a real tokenizer
(SmolLM2's, or the bundled demo's) with the family's special tokens added, and tiny scripted weights
(``scripted_model.py``) that answer every turn the way the family does: ``ok`` and three free tokens
after reasoning in the family's own format (think markers, harmony channels), then the end token.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from localchat.registry import PACKAGE_DIR

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
FREE_TOKENS = 3
PROBES = ([{"role": "user", "content": "alpha"}],
          [{"role": "user", "content": "beta"}, {"role": "assistant", "content": "gamma"},
           {"role": "user", "content": "delta"}])
MODES = ({}, {"enable_thinking": True}, {"enable_thinking": False}, {"reasoning_effort": "low"})
CHATML = ("<|im_start|>", "<|im_end|>")
HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>")
MISTRAL = ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
           "[TOOL_RESULTS]", "[/TOOL_RESULTS]")
GEMMA = ("<bos>", "<start_of_turn>", "<end_of_turn>")


@dataclass(frozen=True)
class Family:
    name: str
    template: str | None  # a file in tests/templates; None: the tokenizer's own
    specials: tuple[str, ...] = CHATML
    eos: str = "<|im_end|>"
    bos: str | None = None
    thinks: bool = False  # <think>/</think> join the vocabulary (mlx_lm then sees a thinking model)
    base: str = "smollm2"  # the tokenizer: "smollm2", or a bundled model's ("demo", "demo-think")
    style: str = ""  # how replies mark reasoning: "think", "harmony", or "" (none); think families: "think"
    calls: str = ""  # how it calls a tool: "tool_call" (Qwen JSON), "mistral", "glm", "json" (Llama), "harmony"

    @property
    def reasoning(self) -> str:
        return self.style or ("think" if self.thinks else "")


FAMILIES = [
    Family("smollm2", None),
    Family("demo", None, base="demo"),
    Family("demo-think", None, base="demo-think", style="think"),
    Family("qwen3", "Qwen-Qwen3-0.6B.jinja", thinks=True, calls="tool_call"),
    Family("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja", calls="tool_call"),
    Family("llama3", "meta-llama-Llama-3.2-3B-Instruct.jinja", eos="<|eot_id|>", bos="<|begin_of_text|>",
           specials=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), calls="json"),
    Family("gemma2", "google-gemma-2-2b-it.jinja", GEMMA, "<end_of_turn>", "<bos>"),
    Family("gemma3", "google-gemma-3-4b-it.jinja", GEMMA, "<end_of_turn>", "<bos>"),
    Family("mistral-v0.2", "mistralai-Mistral-7B-Instruct-v0.2.jinja", MISTRAL, "</s>", "<s>"),
    Family("mistral-v0.3", "mistralai-Mistral-7B-Instruct-v0.3.jinja", MISTRAL, "</s>", "<s>", calls="mistral"),
    Family("mistral-nemo", "mistralai-Mistral-Nemo-Instruct-2407.jinja", MISTRAL, "</s>", "<s>", calls="mistral"),
    Family("phi3.5", "microsoft-Phi-3.5-mini-instruct.jinja", ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
           "<|end|>"),
    Family("deepseek-r1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", thinks=True,
           specials=("<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
           eos="<｜end▁of▁sentence｜>", bos="<｜begin▁of▁sentence｜>"),
    Family("gpt-oss", "openai-gpt-oss-120b.jinja", HARMONY, "<|return|>", style="harmony", calls="harmony"),
    Family("smollm3", "HuggingFaceTB-SmolLM3-3B.jinja", thinks=True),
    Family("glm", "GLM-4.6.jinja", ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
           "<|user|>", thinks=True, calls="glm"),
]
BY_NAME = {f.name: f for f in FAMILIES}


def base_dir(family: Family, smollm2: Path) -> Path:
    return {"smollm2": smollm2, "demo": PACKAGE_DIR / "demo_model",
            "demo-think": PACKAGE_DIR / "demo_think_model"}[family.base]


def family_tokenizer(family: Family, smollm2: Path, out: Path):
    """The base tokenizer with the family's tokens and template, saved at ``out``."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(base_dir(family, smollm2)))
    hf.add_tokens([AddedToken(t, special=True, normalized=False) for t in family.specials])
    if family.thinks:
        hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    if family.bos:
        hf.bos_token = family.bos
    hf.eos_token = family.eos
    if family.template:
        hf.chat_template = (TEMPLATES / family.template).read_text(encoding="utf-8")
    hf.save_pretrained(str(out))
    return hf


def build_family_model(family: Family, smollm2: Path, out: Path, tools: bool = False) -> Path:
    """A loadable model directory (custom ``model_file``, so ``trust_remote_code`` is needed);
    with ``tools``, one that calls ``add(a=2, b=3)`` after a question and answers after its result."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from mlx_lm.utils import load_tokenizer

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    hf = family_tokenizer(family, smollm2, out)
    eos = hf.convert_tokens_to_ids(family.eos)
    config = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64,
              "num_attention_heads": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": len(hf),
              "max_position_embeddings": 4096, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "eos_token_id": [eos], "model_file": "scripted_model.py"}
    (out / "config.json").write_text(json.dumps(config))  # the tokenizer wrapper reads the end token here
    tokenizer = load_tokenizer(out, eos_token_ids=[eos])
    config["script"] = tool_script(tokenizer, hf, family, eos) if tools else script(tokenizer, hf, family, eos)
    mx.random.seed(len(family.name))
    model = llama.Model(llama.ModelArgs.from_dict(config))
    weights = {f"inner.{k}": v for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config))
    shutil.copy(HERE / "scripted_model.py", out / "scripted_model.py")
    return out


def script(tokenizer, hf, family: Family, eos: int) -> dict:
    """The scripted replies: one variant per distinct generation prompt the family's modes render."""
    def ids(text: str) -> list[int]:
        return hf.encode(text, add_special_tokens=False)

    variants, tails = [], []
    for mode in MODES:
        tail = generation_tail(tokenizer, mode)
        if tail is None or tail in [v[:len(tail)] for v in variants]:
            continue
        variants.append(tail + ids(reply_head(family, tokenizer.decode(tail))) + [-1] * FREE_TOKENS + [eos])
        tails.append(len(tail))
    return {"variants": variants, "tail": tails, "free": free_tokens(hf)}


ADD = {"type": "function", "function": {"name": "add", "description": "Add two whole numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
ADD_ARGUMENTS = {"a": 2, "b": 3}


def after_a_result(result: str, call_id: str) -> list[dict]:
    """A conversation whose last message is the result of a call to add."""
    call = {"id": call_id, "type": "function", "function": {"name": "add", "arguments": ADD_ARGUMENTS}}
    return [
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "name": "add", "content": result},
    ]


def call_text(family: Family, tail: str) -> str:
    """The family's own way of calling add(a=2, b=3), after what its reasoning writes first."""
    arguments = json.dumps(ADD_ARGUMENTS)
    if family.calls == "harmony":
        return ("<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>commentary to=functions.add "
                f"<|constrain|>json<|message|>{arguments}<|call|>")
    head = reply_head(family, tail).removesuffix("ok")
    return head + {"tool_call": f'<tool_call>\n{{"name": "add", "arguments": {arguments}}}\n</tool_call>',
                   "mistral": f'[TOOL_CALLS] [{{"name": "add", "arguments": {arguments}}}]',
                   "glm": "<tool_call>add<arg_key>a</arg_key><arg_value>2</arg_value><arg_key>b</arg_key>"
                          "<arg_value>3</arg_value></tool_call>",
                   "json": f'{{"name": "add", "parameters": {arguments}}}'}[family.calls]


def tool_script(tokenizer, hf, family: Family, eos: int) -> dict:
    """Two replies: a call of add after a question, an answer (``ok`` and free tokens) after its result."""
    def ids(text: str) -> list[int]:
        return hf.encode(text, add_special_tokens=False)

    asked = generation_tail(tokenizer, {"tools": [ADD]})
    a, b = (tokenizer.apply_chat_template(after_a_result(r, i), add_generation_prompt=True, tools=[ADD])
            for r, i in (("17", "abc123def"), ("42", "zyx987wvu")))  # what every call's result ends with
    answered = _common_tail(a, b)
    variants = [asked + ids(call_text(family, tokenizer.decode(asked))) + [eos],
                answered + ids(reply_head(family, tokenizer.decode(answered))) + [-1] * FREE_TOKENS + [eos]]
    return {"variants": variants, "tail": [len(asked), len(answered)], "free": free_tokens(hf)}


def _common_tail(a: list[int], b: list[int]) -> list[int]:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return list(a[len(a) - n:])


def generation_tail(tokenizer, mode: dict) -> list[int] | None:
    """The ids every prompt of this mode ends with (after the last user message)."""
    try:
        a, b = (tokenizer.apply_chat_template(p, add_generation_prompt=True, **mode) for p in PROBES)
    except Exception:  # a mode the template does not take
        return None
    return _common_tail(a, b)


def reply_head(family: Family, tail: str) -> str:
    """What the family writes before its answer, given how the generation prompt ends."""
    if family.reasoning == "harmony":
        return "<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>final<|message|>ok"
    if family.reasoning != "think":
        return "ok"
    if tail.rfind("<think>") > tail.rfind("</think>"):
        return "plan</think>ok"
    return "ok" if "</think>" in tail else "<think>plan</think>ok"


def free_tokens(hf, limit: int = 1500) -> list[int]:
    """Plain word tokens (letters, optionally after a space) the free part may choose from."""
    vocab = hf.get_vocab()
    special = set(hf.all_special_ids) | {i for t, i in vocab.items() if t.startswith("<")}
    plain = sorted(i for t, i in vocab.items() if re.fullmatch(r"(Ġ|▁)?[a-z]{3,}", t) and i not in special)
    return plain[:limit]


def built(families: list[Family], smollm2: Path, name: str, tools: bool = False) -> dict[str, Path]:
    """The families' model directories, built once per machine under ``name``, keyed by what they
    are made of (templates, this file, the scripted model, the base tokenizer)."""
    import hashlib

    from machine_cache import machine_cache

    parts = [*sorted(TEMPLATES.glob("*.jinja")), HERE / "families.py", HERE / "scripted_model.py"]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in parts) + str(smollm2).encode()).hexdigest()[:16]
    with machine_cache(f"{name}-{digest}") as root:
        if not (root / "done").is_file():
            shutil.rmtree(root, ignore_errors=True)
            for family in families:
                build_family_model(family, smollm2, root / family.name, tools=tools)
            (root / "done").touch()
    return {family.name: root / family.name for family in families}
