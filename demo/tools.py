"""Fine-tune the demo model to call a tool: ``add`` from ``examples/tools/add.py``, in English and
Chinese, then answer from its result.

    uv run python -m demo.tools --out localchat/demo_tools_model

    system:    You are a helpful assistant.\\n\\nTools: add(a, b)
    user:      What is 12 plus 30?                    (12 加 30 等于多少？)
    assistant: <tool_call>{"name": "add", "arguments": {"a": 12, "b": 30}}</tool_call>
    tool:      42
    assistant: The answer is 42.                      (答案是 42。)

The template (``TEMPLATE``, written beside the weights) is ChatML with the offered tools named in
the system message and Qwen's ``<tool_call>`` format, so mlx_lm itself recognises the family and
reads the calls with its own parser. Numbers are single-digit tokens, so the demo's copy circuit
carries them from the question into the call and from the result into the answer. 70 % of the rows
stay the demo's own mixture, some of them with tools offered (offering a tool must not change what
it says to anything else). It starts from the shipped model's weights (dequantized), keeps its
tokenizer and is quantized the same way after; held-out figures are measured through localchat's
own loop (``ChatSession`` with the tool running in its process). Deterministic for a given --seed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from demo.card import missed_criteria
from demo.corpus import training_dialogue
from demo.notes import within_a_point
from demo.train import fine_tune_args, init_weights, join_workers, log, save_and_reload, stress_test, train
from demo.evaluate import evaluate
from demo.tokenizer import load_init_tokenizer
from localchat.demo import MODEL_DIR
from localchat.environment import collect

TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "Tools: {% for tool in tools %}{{ tool.function.name }}({{ tool.function.parameters.properties | list | join(', ') }})"
    "{% if not loop.last %}, {% endif %}{% endfor %}<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{% for tool_call in message.tool_calls %}{% set tool_call = tool_call.function %}<tool_call>"
    '{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>{{ message.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ADD_FILE = Path(__file__).resolve().parents[1] / "examples" / "tools" / "add.py"
QUESTIONS = {"en": ["What is {a} plus {b}?", "Add {a} and {b}.", "How much is {a} + {b}?", "What is {a} + {b}?"],
             "zh": ["{a} 加 {b} 等于多少？", "请算 {a} 加 {b}。", "{a} 加 {b} 是多少？", "{a} + {b} 等于多少？"]}
ANSWER = {"en": "The answer is {s}.", "zh": "答案是 {s}。"}  # one number to copy: the tool's result
SYSTEM = "You are a helpful assistant."
MAX_ROW_TOKENS = 420
REMAKE = ("uv run python -m demo.tools --out /tmp/tools-1\n    "
          "uv run python -m demo.tools --demo /tmp/tools-1 --out localchat/demo_tools_model --share 0.6 --lr 5e-4 "
          "--seed 1")


def add_spec() -> dict:
    from localchat.tools.host import ToolHost

    host = ToolHost([ADD_FILE])
    try:
        return host.specs[0]
    finally:
        host.close()


def tool_dialogue(rng: random.Random, lang: str) -> list[dict]:
    """Perhaps some small talk, then a sum asked for, called, answered."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    call = {"id": "".join(rng.choice("abcdef0123456789") for _ in range(9)), "type": "function",
            "function": {"name": "add", "arguments": {"a": a, "b": b}}}
    before = training_dialogue(rng, "main", recovery=0.0).messages()[1:] if rng.random() < 0.3 else []
    return [{"role": "system", "content": SYSTEM}, *before[-4:],
            {"role": "user", "content": rng.choice(QUESTIONS[lang]).format(a=a, b=b)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "name": "add", "content": str(a + b)},
            {"role": "assistant", "content": ANSWER[lang].format(a=a, b=b, s=a + b)}]


def encode(tok, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], list[int]]:
    """Token ids of the conversation as the template renders it, and a mask over the assistant's
    messages (calls and answers, their ``<|im_end|>`` included)."""
    def rendered(upto: int) -> str:
        return tok.apply_chat_template(messages[:upto], tools=tools, tokenize=False) if upto else ""

    text, spans = rendered(len(messages)), []
    for k, message in enumerate(messages):
        if message["role"] == "assistant":
            start = len(rendered(k)) + len("<|im_start|>assistant\n")
            spans.append((start, len(rendered(k + 1)) - 1))  # up to <|im_end|>, not the newline
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    mask = [int(any(s < e2 and s2 < e for s2, e2 in spans)) for s, e in enc["offset_mapping"]]
    return enc["input_ids"], mask


def training_row(tok, rng: random.Random, share: float, spec: dict) -> tuple[list[int], list[int]]:
    if rng.random() < share:
        return encode(tok, tool_dialogue(rng, rng.choice(["en", "zh"])), [spec])
    dialogue = training_dialogue(rng, "main", recovery=0.04)
    tools = [spec] if rng.random() < 0.3 else None  # offering a tool changes nothing else it says
    messages = dialogue.messages()
    return encode(tok, messages if messages[0]["role"] == "system" else [{"role": "system", "content": SYSTEM},
                                                                         *messages], tools)


def evaluate_tools(path: Path, n: int, seed: int) -> dict:
    """Held-out sums through localchat's own loop: a call of add with the question's numbers, then
    an answer holding the sum; per language."""
    from localchat.backends import GenerationParams
    from localchat.backends.inproc import load_inproc
    from localchat.conversation.history import Conversation
    from localchat.conversation.turn import ChatSession
    from localchat.registry import ModelRef
    from localchat.tools.host import ToolHost
    from localchat.tools.runner import ToolRunner, approve_all

    rng, host = random.Random(seed), ToolHost([ADD_FILE])
    backend = load_inproc(ModelRef("demo-tools", str(path), "local"), path)
    backend.offer_tools(host.specs)
    figures = {}
    try:
        for lang in ("en", "zh"):
            called = answered = 0
            failures = []
            for _ in range(n):
                a, b = rng.randint(0, 99), rng.randint(0, 99)
                chat = ChatSession(backend, Conversation(SYSTEM), GenerationParams(max_tokens=64),
                                   tools=ToolRunner(host, approve_all))
                result = chat.ask(rng.choice(QUESTIONS[lang]).format(a=a, b=b))
                good_call = [(c["name"], c["arguments"]) for s in result.steps for c in s.calls] == \
                    [("add", {"a": a, "b": b})]
                called += good_call
                answered += good_call and result.committed and str(a + b) in result.text
                if not (good_call and str(a + b) in result.text) and len(failures) < 5:
                    failures.append({"asked": [a, b], "calls": [s.calls for s in result.steps], "answer": result.text})
            figures[f"call_{lang}"] = {"passed": called, "total": n, "rate": round(called / n, 4)}
            figures[f"answer_{lang}"] = {"passed": answered, "total": n, "rate": round(answered / n, 4),
                                         "failures": failures}
    finally:
        host.close()
    return figures


def model_card(report: dict, card: dict) -> str:
    def row(name: str, was: dict | None, now: dict) -> str:
        before = f"{was['passed']}/{was['total']}" if was else "–"
        return f"| {name} | {before} | {now['passed']}/{now['total']} |"

    rows = [row(b, card["behaviours"][b], report["behaviours"][b]) for b in report["behaviours"]]
    rows += [row(f"stress: {b}", card["stress"][b], report["stress"][b]) for b in report["stress"]]
    rows += [row(b, None, s) for b, s in report["tools"].items()]
    moved = ", ".join(report["card_figures_moved"]) or "none"
    return f"""# demo-tools: the demo model, taught to call a tool

The bundled demo model fine-tuned ({report['tools_fine_tune']['steps']} steps) to call `add` from
`examples/tools/add.py` when asked for a sum, in English and Chinese, and to answer from its result:

    uv run localchat chat -m demo-tools --tools examples/tools/add.py "What is 12 plus 30?"

Its template names the offered tools in the system message and writes calls as Qwen does
(`<tool_call>{{"name": …, "arguments": …}}</tool_call>`), so mlx_lm reads them with its own parser.
It knows this one tool and this one kind of question; everything else is the demo model's (its card:
`localchat/demo_model/README.md`). It ships beside the demo, not in it; the card's figures that moved
by more than one point: {moved}.

Held-out conversations, temperature 0, through localchat's own tool loop, measured on {report['hardware']}:

| behaviour | demo | demo-tools |
|---|---|---|
{chr(10).join(rows)}

`call_*`: the first reply is exactly add(a, b) with the question's numbers; `answer_*`: then the
answer holds the sum. Remake it (deterministic for the seed; {report['total_minutes']:.0f} minutes here):

    {REMAKE}
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--share", type=float, default=0.3, help="share of the rows that call the tool")
    p.add_argument("--tools-n", type=int, default=100, help="held-out sums per language")
    p.add_argument("--evaluate-only", action="store_true", help="score the model already in --out (no training)")
    return fine_tune_args(p, argv, steps=600, lr=3e-4, eval_n=200)


def main(argv=None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    group = join_workers(argv, args.workers, module="demo.tools")
    started = time.perf_counter()
    before = json.loads((MODEL_DIR / "eval.json").read_text())
    rng, spec = random.Random(args.seed), add_spec()
    tok = load_init_tokenizer(args.demo)
    tok.chat_template = TEMPLATE
    if args.evaluate_only:
        from mlx_lm import load

        (qmodel, qtok), train_s = load(str(args.out)), json.loads((args.out / "eval.json").read_text()).get(
            "tools_fine_tune", {}).get("training_minutes", 0) * 60 if (args.out / "eval.json").exists() else 0.0
    else:
        rows = [training_row(tok, rng, args.share, spec) for _ in range(args.steps * args.batch)]
        rows = [r for r in rows if len(r[0]) <= MAX_ROW_TOKENS]
        log(group, f"corpus: {len(rows):,} conversations, {sum(len(ids) for ids, _ in rows):,} tokens")
        config = json.loads((args.demo / "config.json").read_text())
        for key in ("quantization", "quantization_config"):
            config.pop(key, None)
        model = train(args, tok, [rows], config, group, init_weights(args.demo))
        train_s = time.perf_counter() - started
        if group.rank() != 0:
            return None
        qmodel, qtok = save_and_reload(model, tok, config, args)
    report = {**{k: before[k] for k in ("layers", "hidden", "heads", "parameters", "vocab")},
              "tools_fine_tune": {"seed": args.seed, "steps": args.steps, "batch": args.batch, "lr": args.lr,
                                  "share": args.share, "training_minutes": round(train_s / 60, 2)},
              "hardware": collect().hardware_label,
              **evaluate(qmodel, qtok, n=args.eval_n, seed=before["seed"] + 10_000),
              "stress": stress_test(qmodel, qtok, n=args.eval_n, seed=before["seed"] + 20_000),
              "tools": evaluate_tools(args.out, n=args.tools_n, seed=args.seed + 40_000)}
    report["card_figures_moved"] = within_a_point(before, report)
    report["missed_criteria"] = missed_criteria(report)
    report["total_minutes"] = round((time.perf_counter() - started) / 60, 2)
    (args.out / "eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (args.out / "README.md").write_text(model_card(report, before), encoding="utf-8")
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return report


if __name__ == "__main__":
    main()
