"""The agents' cases that break a prompt cache, measured: what ``X-Localchat-Prefix-Cache`` says for
each, through serve's gateway APIs as the agents send them.

    uv run python scripts/cache_breaks.py [--model demo-tools]

One ``localchat serve -m MODEL --api anthropic,responses`` (stopped at the end). Each case is a
conversation of two agent steps; the second step is the first one grown by a
tool round and a user message, with one thing changed the way agents change it:

- ``clock``: the system prompt holds the time, which moves between steps;
- ``tools reordered``: the same tools in another order (an agent whose MCP servers connected in
  another order);
- ``tool result rewritten``: an earlier tool result replaced by a stub (an agent clearing old results);
- ``thinking dropped``: the earlier turn's thinking blocks (Responses: reasoning items) left out;
- ``unchanged``: nothing changed (the control).

Each case runs through Anthropic Messages (the ``anthropic`` SDK, streaming, as Claude Code sends)
and OpenAI Responses (the ``openai`` SDK, streaming, ``store: false``, as Codex sends); every case's
prefix is its own, so no case reads another's cache. Printed: the second step's header per case and API.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

import anthropic
import openai

from localchat.environment import collect
from localchat.serve.started import StartedServe

HEADER = "x-localchat-prefix-cache"
TOOLS = [("Read", "Read a file.", "path"), ("Bash", "Run a command.", "command"), ("Edit", "Edit a file.", "path")]
FILE = "def area(r):\n    return 3.14159 * r * r\n"
CASES = ("unchanged", "clock", "tools reordered", "tool result rewritten", "thinking dropped")


def system_prompt(case: str, step: int, tag: str) -> str:
    clock = f" The time is 10:4{step}:0{step}." if case == "clock" else ""
    return f"[{tag}] You are a coding agent. Answer briefly; call tools when you need a file.{clock}"


def tool_order(case: str, step: int) -> list[tuple[str, str, str]]:
    return TOOLS[::-1] if case == "tools reordered" and step == 2 else TOOLS


def result_text(case: str, step: int) -> str:
    return "[Old tool result content cleared]" if case == "tool result rewritten" and step == 2 else FILE


def anthropic_step(client: anthropic.Anthropic, case: str, step: int, tag: str, said: str) -> tuple[str, str]:
    thinking = [] if case == "thinking dropped" and step == 2 else [
        {"type": "thinking", "thinking": "The user wants the area function; read it first.", "signature": "x"}]
    messages: list[dict] = [
        {"role": "user", "content": "What does area() in geometry.py do?"},
        {"role": "assistant", "content": [*thinking, {"type": "tool_use", "id": "toolu_1", "name": "Read",
                                                      "input": {"path": "geometry.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": result_text(case, step)}]},
    ]
    if step == 2:
        messages += [{"role": "assistant", "content": [{"type": "text", "text": said}]},
                     {"role": "user", "content": "And what is the area for r = 2?"}]
    tools = [{"name": n, "description": d, "input_schema": {"type": "object", "properties": {p: {"type": "string"}}}}
             for n, d, p in tool_order(case, step)]
    raw = client.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=8, stream=True,
                                                   system=system_prompt(case, step, tag), messages=messages,
                                                   tools=tools, extra_body={"temperature": 0.0})
    text = "".join(e.delta.text for e in raw.parse()
                   if e.type == "content_block_delta" and e.delta.type == "text_delta")
    return raw.headers.get(HEADER, "(none)"), text


def responses_step(client: openai.OpenAI, case: str, step: int, tag: str, said: str) -> tuple[str, str]:
    reasoning = [] if case == "thinking dropped" and step == 2 else [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Read the file first."}]}]
    items: list[dict] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                         "text": "What does area() in geometry.py do?"}]},
        *reasoning,
        {"type": "function_call", "call_id": "call_1", "name": "Read", "arguments": '{"path": "geometry.py"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": result_text(case, step)},
    ]
    if step == 2:
        items += [{"type": "message", "role": "assistant",
                   "content": [{"type": "output_text", "text": said}]},
                  {"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "And what is the area for r = 2?"}]}]
    tools = [{"type": "function", "name": n, "description": d,
              "parameters": {"type": "object", "properties": {p: {"type": "string"}}}}
             for n, d, p in tool_order(case, step)]
    raw = client.responses.with_raw_response.create(model="gpt-5-codex", instructions=system_prompt(case, step, tag),
                                                    input=items, tools=tools, max_output_tokens=8, stream=True,
                                                    store=False, temperature=0.0)
    text = "".join(e.delta for e in raw.parse() if e.type == "response.output_text.delta")
    return raw.headers.get(HEADER, "(none)"), text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo-tools")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        log = Path(home) / "serve.log"
        serve = StartedServe(Path(home), "-m", args.model, "--api", "anthropic,responses", log=open(log, "w"))
        try:
            assert serve.wait_ready(), log.read_text()[-2000:]
            claude = anthropic.Anthropic(base_url=serve.url, api_key="local")
            codex = openai.OpenAI(base_url=serve.url + "/v1", api_key="local")
            print(f"# {args.model} on {collect().hardware_label} · serve --api anthropic,responses")
            print("| case | API | step 1 | step 2 |\n|---|---|---|---|")
            for case in CASES:
                for api, step, client in (("Anthropic Messages", anthropic_step, claude),
                                          ("Responses", responses_step, codex)):
                    tag = uuid.uuid4().hex[:8]  # a prefix of this case's own
                    first, said = step(client, case, 1, tag, "")
                    second, _ = step(client, case, 2, tag, said)  # (the agent sends back what the model said)
                    print(f"| {case} | {api} | `{first}` | `{second}` |")
            print("\nthe engine's log lines for the breaks:")
            for line in (Path(home) / "logs" / f"server-{serve.port}.log").read_text().splitlines():
                if "prompt cache: broke at" in line:
                    print("  " + line.split(" - WARNING - ", 1)[-1][:300])
        finally:
            serve.stop()

if __name__ == "__main__":
    main()
