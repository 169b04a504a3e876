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

from demo.corpus import PLAIN_SYSTEMS, training_dialogue
from demo.sibling import card_table_rows, fine_tune, write_report
from demo.tokenizer import load_init_tokenizer
from demo.train import fine_tune_args, join_workers, log
from localchat.demo_codes import MODEL_DIR

TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "Tools: {% for tool in tools %}{{ tool.function.name }}({{ tool.function.parameters.properties | list | join(', "
    "') }})"
    "{% if not loop.last %}, {% endif %}{% endfor %}<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{% for tool_call in message.tool_calls %}{% set tool_call = tool_call.function %}<tool_call>"
    '{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>{{ message.content "
    "}}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ADD_FILE = Path(__file__).resolve().parents[1] / "examples" / "tools" / "add.py"
QUESTIONS = {"en": ["What is {a} plus {b}?", "Add {a} and {b}.", "How much is {a} + {b}?", "What is {a} + {b}?"],
             "zh": ["{a} 加 {b} 等于多少？", "请算 {a} 加 {b}。", "{a} 加 {b} 是多少？", "{a} + {b} 等于多少？"]}
ANSWER = {"en": "The answer is {s}.", "zh": "答案是 {s}。"}  # one number to copy: the tool's result
SYSTEM = "You are a helpful assistant."
MAX_ROW_TOKENS = 480
REMAKE = ("uv run python -m demo.tools --out /tmp/tools-1\n    "
          "uv run python -m demo.tools --demo /tmp/tools-1 --out /tmp/tools-2 --share 0.6 --lr 5e-4 --seed 1\n    "
          "uv run python -m demo.tools --demo /tmp/tools-2 --out /tmp/tools-3 --share 0.8 --lr 3e-4 --seed 2\n    "
          "uv run python -m demo.tools --demo /tmp/tools-3 --out /tmp/tools-4 --share 0.9 --lr 2e-4 --seed 3\n    "
          "uv run python -m demo.tools --demo /tmp/tools-4 --out /tmp/tools-5 --share 0.8 --lr 2e-4 --seed 4\n    "
          "uv run python -m demo.tools --demo /tmp/tools-5 --out /tmp/tools-6 --share 0.8 --lr 2e-4 --seed 5 "
          "--renamed 0.75\n    "
          "uv run python -m demo.tools --demo /tmp/tools-6 --out localchat/demo_tools_model --share 0.8 --lr 3e-4 "
          "--seed 7 --renamed 0.9 --common 0.5")
STAGES = "seven stages of 600 steps, each from the one before"
LETTERS = "abcdefghijklmnopqrstuvwxyz"
COMMON_SERVERS = ("math", "calc", "tools", "demo", "util", "numbers", "local", "mcp")  # for --common
OTHER_TOOLS = [  # tools offered beside the sum, as MCP servers offer them: the model must pick the one that adds
    ("get_current_time", "Get the current time in a timezone.", ["timezone"]),
    ("convert_time", "Convert a time between timezones.", ["source_timezone", "time", "target_timezone"]),
    ("search", "Search the web.", ["query"]),
    ("read_file", "Read a text file.", ["path"]),
    ("list_directory", "List a directory.", ["path"]),
]


def add_spec() -> dict:
    from localchat.tools.host import ToolHost

    host = ToolHost([ADD_FILE])
    try:
        return host.specs[0]
    finally:
        host.close()


def sum_exchange(rng: random.Random, lang: str, name: str = "add") -> list[dict]:
    """A sum asked for, the call of the tool that adds (``name``), its result and the answer."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    call = {"id": "".join(rng.choice("abcdef0123456789") for _ in range(9)), "type": "function",
            "function": {"name": name, "arguments": {"a": a, "b": b}}}
    return [{"role": "user", "content": rng.choice(QUESTIONS[lang]).format(a=a, b=b)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "name": name, "content": str(a + b)},
            {"role": "assistant", "content": ANSWER[lang].format(a=a, b=b, s=a + b)}]


def prefixed(rng: random.Random, name: str, common: float = 0.0) -> str:
    """``name`` as an MCP server exposes it (``SERVER_TOOL``): a prefix of random letters, so that the
    model learns to copy the name it is offered rather than to remember any, or (``common`` of the
    time) a server name that is common (``math``: the example server's)."""
    if rng.random() < common:
        return f"{rng.choice(COMMON_SERVERS)}_{name}"
    prefix = "".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 8)))
    return f"{prefix}{rng.choice('__-')}{name}"


def offered_tools(rng: random.Random, spec: dict, renamed: float, common: float = 0.0) -> tuple[str, list[dict]]:
    """The adding tool's name and the tools offered with it: ``add`` itself, or (``renamed`` of the
    time) a prefixed name, sometimes among other tools."""
    name = prefixed(rng, "add", common) if rng.random() < renamed else "add"
    adding = {**spec, "function": {**spec["function"], "name": name}}
    others = [{"type": "function", "function": {
        "name": prefixed(rng, other) if name != "add" else other, "description": text,
        "parameters": {"type": "object", "properties": {p: {"type": "string"} for p in params}, "required": params}}}
        for other, text, params in rng.sample(OTHER_TOOLS, rng.choice([0, 0, 1, 2]))]
    tools = [adding, *others]
    rng.shuffle(tools)
    return name, tools


def tool_dialogue(rng: random.Random, lang: str, name: str = "add") -> list[dict]:
    """A sum asked for, called and answered, after perhaps some small talk and earlier sums (each
    called again: a result in history is not this question's), with a system message or without
    one (the template then writes the tools alone)."""
    talk = training_dialogue(rng, "main", recovery=0.0).messages()[1:][-4:] if rng.random() < 0.3 else []
    earlier = [m for _ in range(rng.choice([0, 0, 1, 2])) for m in sum_exchange(rng, rng.choice(["en", "zh"]), name)]
    before = talk + earlier if rng.random() < 0.5 else earlier + talk
    system = rng.choice([SYSTEM, None, rng.choice(PLAIN_SYSTEMS)])
    return [{"role": "system", "content": system}] * bool(system) + before + sum_exchange(rng, lang, name)


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


def training_row(tok, rng: random.Random, share: float, spec: dict, renamed: float = 0.0,
                 common: float = 0.0) -> tuple[list[int], list[int]]:
    if rng.random() < share:
        name, tools = offered_tools(rng, spec, renamed, common)
        return encode(tok, tool_dialogue(rng, rng.choice(["en", "zh"]), name), tools)
    dialogue = training_dialogue(rng, "main", recovery=0.04)
    tools = [spec] if rng.random() < 0.3 else None  # offering a tool changes nothing else it says
    messages = dialogue.messages()
    return encode(tok, messages if messages[0]["role"] == "system" else [{"role": "system", "content": SYSTEM},
                                                                         *messages], tools)


class RenamedAdd:
    """``add`` from ``examples/tools/add.py`` offered under another name, beside tools that do
    nothing (a tool source, as an MCP server is one): held-out names for the evaluation."""

    def __init__(self, host, name: str, others: list[dict]):
        self.host, self.added, self.name = host, name, "renamed add"
        self.specs = [{**host.specs[0], "function": {**host.specs[0]["function"], "name": name}}, *others]

    def call(self, name: str, arguments: dict):
        return self.host.call("add", arguments)

    def origin(self, name: str) -> str:
        return self.name

    def refresh(self) -> bool:
        return False

    def close(self) -> None:
        pass


def evaluate_tools(path: Path, n: int, seed: int) -> dict:
    """Held-out sums through localchat's own loop, per language: a first sum (half of the
    conversations with the system message, half without one), then a second in the same
    conversation, its first in history. ``call``: the first reply calls add with the question's
    numbers; ``answer``: then the answer holds the sum; ``second``: both, for the second sum;
    ``named``: a first sum called and answered when the tool is offered under a held-out prefixed
    name (``xq_add``, as an MCP server exposes it), sometimes beside other tools; ``named_raw``: the
    same without the call grammar (as over HTTP, where mlx_lm.server masks nothing)."""
    from localchat.backends.inproc import load_inproc
    from localchat.registry import ModelRef
    from localchat.tools.host import ToolHost

    rng, host = random.Random(seed), ToolHost([ADD_FILE])
    backend = load_inproc(ModelRef("demo-tools", str(path), "local"), path)
    figures = {}
    try:
        for lang in ("en", "zh"):
            passed, failures = {"call": 0, "answer": 0, "second": 0, "named": 0, "named_raw": 0}, []
            for k in range(n):
                first, second = _conversation(backend, host, rng, lang, system=k % 2 == 0, turns=2)
                passed["call"] += first[0]
                passed["answer"] += first[1]
                passed["second"] += second[1]
                failures += [f for f in (first[2], second[2]) if f][:max(0, 5 - len(failures))]
                renamed = RenamedAdd(host, prefixed(rng, "add").replace("-", "_"), offered_tools(rng, host.specs[0],
                                                                                                  1.0)[1][1:])
                passed["named"] += _conversation(backend, renamed, rng, lang, system=k % 2 == 1, turns=1)[0][1]
                backend.grammar.masks_calls = False  # as mlx_lm.server runs it: no call grammar
                try:
                    passed["named_raw"] += _conversation(backend, renamed, rng, lang, system=k % 2 == 1, turns=1)[0][1]
                finally:
                    backend.grammar.masks_calls = True
            for name, count in passed.items():
                figures[f"{name}_{lang}"] = {"passed": count, "total": n, "rate": round(count / n, 4)}
            figures[f"second_{lang}"]["failures"] = failures
    finally:
        host.close()
    return figures


def _conversation(backend, source, rng: random.Random, lang: str, *, system: bool, turns: int) -> list[tuple]:
    """``turns`` sums in one conversation with ``source``'s tools: (called, answered, failure) each."""
    from localchat.backends import GenerationParams
    from localchat.conversation.history import Conversation
    from localchat.conversation.turn import ChatSession
    from localchat.tools.runner import ToolRunner, approve_all

    backend.offer_tools(source.specs)
    name = getattr(source, "added", "add")
    chat = ChatSession(backend, Conversation(SYSTEM if system else None), GenerationParams(max_tokens=64),
                       tools=ToolRunner([source], approve_all))
    outcomes = []
    for turn in range(turns):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        result = chat.ask(rng.choice(QUESTIONS[lang]).format(a=a, b=b))
        called = [(c["name"], c["arguments"]) for s in result.steps for c in s.calls] == [(name, {"a": a, "b": b})]
        answered = called and result.committed and str(a + b) in result.text
        failure = None if answered else {"turn": turn + 1, "tool": name, "asked": [a, b],
                                         "calls": [s.calls for s in result.steps], "answer": result.text}
        outcomes.append((called, answered, failure))
    return outcomes


def model_card(report: dict, card: dict) -> str:
    rows = card_table_rows(report, card, report["tools"])
    moved, clean = ", ".join(report["card_figures_moved"]) or "none", report["clean_endings"]
    return f"""# demo-tools: the demo model, taught to call a tool

The bundled demo model fine-tuned ({STAGES}) to call `add` from
`examples/tools/add.py` when asked for a sum, in English and Chinese, and to answer from its result;
the sixth stage taught it to call the adding tool by the name it is offered under, the seventh to
write common server names (`math_add` from the MCP server in `examples/mcp/add.json`) without the
call grammar, as it must through mlx_lm.server:

    uv run localchat chat -m demo-tools --tools examples/tools/add.py "What is 12 plus 30?"

Its template names the offered tools in the system message and writes calls as Qwen does
(`<tool_call>{{"name": …, "arguments": …}}</tool_call>`), so mlx_lm reads them with its own parser.
It knows this one tool and this one kind of question; everything else is the demo model's (its card:
`localchat/demo_model/README.md`). It ships beside the demo, not in it; the card's figures that moved
by more than one point: {moved}; replies that end cleanly: {clean["clean"]:,}/{clean["total"]:,}
(the demo's: {card["clean_endings"]["clean"]:,}/{card["clean_endings"]["total"]:,}).

Held-out conversations, temperature 0 (the sums through localchat's own tool loop), on {report["hardware"]}:

| behaviour | demo | demo-tools |
|---|---|---|
{chr(10).join(rows)}

`call_*`: the first reply is exactly add(a, b) with the question's numbers; `answer_*`: then the
answer holds the sum; `second_*`: both, for a second sum asked in the same conversation (half of the
conversations with a system message, half without); `named_*`: a first sum called and answered when
the tool is offered under a held-out prefixed name (`xq_add`, as an MCP server's `SERVER_TOOL` name
is), sometimes beside other tools, its calls decoded under the call grammar (their arguments under
`add`'s schema) as localchat runs them in-process; `named_raw_*`: the same without that grammar, as
through mlx_lm.server (a held-out prefix is rarely copied whole; the eight common server names of its
training, `math` among them, were written right in 64 of 64 calls through mlx_lm.server, by hand). Remake it (about {report["total_minutes"]:.0f} minutes a stage
here). Each stage is deterministic for its seed, but the shipped weights' first stage taught an earlier wording of the
answer and stages 1-4 taught sums with no earlier sum in the conversation (a second sum went
uncalled: 0/20), so a remake is a model of the same kind, not the same bytes:

    {REMAKE}
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--share", type=float, default=0.3, help="share of the rows that call the tool")
    p.add_argument("--renamed", type=float, default=0.0, help="share of those that offer it under a prefixed name")
    p.add_argument("--common", type=float, default=0.0, help="share of the prefixes that are common server names")
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

        trained = load(str(args.out)) if group.rank() == 0 else None
        train_s = earlier_training_seconds(args.out)
        started -= train_s  # the stage's time, on its card, counts the training it scores
    else:
        rows = [training_row(tok, rng, args.share, spec, args.renamed, args.common)
                for _ in range(args.steps * args.batch)]
        rows = [r for r in rows if len(r[0]) <= MAX_ROW_TOKENS]
        log(group, f"corpus: {len(rows):,} conversations, {sum(len(ids) for ids, _ in rows):,} tokens")
        trained, train_s = fine_tune(args, tok, rows, group), time.perf_counter() - started
    if trained is None:
        return None
    tools = evaluate_tools(args.out, n=args.tools_n, seed=args.seed + 40_000)
    return write_report(args, *trained, kind="tools", before=before, own={"tools": tools}, started=started,
                        train_s=train_s, card=model_card)


def earlier_training_seconds(out: Path) -> float:
    """What the model in ``out`` took to train, from its report (for ``--evaluate-only``)."""
    try:
        return json.loads((out / "eval.json").read_text())["tools_fine_tune"]["training_minutes"] * 60
    except (OSError, ValueError, KeyError):
        return 0.0


if __name__ == "__main__":
    main()
