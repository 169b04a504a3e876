"""``localchat parity``: the same greedy conversation in-process and through mlx_lm.server.

Both sides go through the same ChatSession; they must send the same number of prompt tokens and
get the same replies (a thinking model's reasoning and answer alike). The first difference is
named (turn, reply token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from localchat.backends import Backend, GenerationParams
from localchat.conversation.history import Conversation
from localchat.conversation.turn import ChatSession, TurnResult
from localchat.model_loader import load_inproc_or_vision
from localchat.registry import DEFAULT_MODEL, ModelRef, local_dir, resolve
from localchat.server.distributed import Ranks
from localchat.server.launch import free_port, start_ready
from localchat.vision.image import sample_picture
from localchat.vision.support import is_vision

PARITY_TURNS = ("Remember the code harbor 17. Reply only OK.", "How are you?",
                "What was the code? Reply with the code only.")
PICTURE_TURNS = ("What is in the picture?", "What colour was it?", "What shape was it?")  # a vision model's


@dataclass
class ParityReport:
    model: str
    turns: list[dict] = field(default_factory=list)
    first_difference: str | None = None

    @property
    def ok(self) -> bool:
        return self.first_difference is None


def play(backend: Backend, ref: ModelRef) -> list[TurnResult]:
    session = ChatSession(backend, Conversation.for_backend(backend, ref.default("system")),
                          GenerationParams(temperature=0.0, max_tokens=ref.default("max_tokens", 256)))
    if not is_vision(ref):
        return [session.ask(turn) for turn in PARITY_TURNS]
    session.conversation.attached = (sample_picture(),)  # the first turn shows a red circle
    return [session.ask(turn) for turn in PICTURE_TURNS]


def compare(model: str, inproc_results: list[TurnResult], server_results: list[TurnResult],
            tokenizer) -> ParityReport:
    report = ParityReport(model=model)
    for i, (a, b) in enumerate(zip(inproc_results, server_results), 1):
        report.turns.append({"turn": i, "inproc_prompt_tokens": a.stats.prompt_tokens,
                             "server_prompt_tokens": b.stats.prompt_tokens,
                             "inproc_text": a.text, "server_text": b.text,
                             "inproc_reasoning": a.reasoning, "server_reasoning": b.reasoning})
        if report.first_difference:
            continue
        if a.stats.prompt_tokens != b.stats.prompt_tokens:
            report.first_difference = (f"turn {i}: prompt tokens {a.stats.prompt_tokens} in-process "
                                       f"vs {b.stats.prompt_tokens} via the server")
        elif a.reasoning != b.reasoning:
            report.first_difference = f"turn {i}, reasoning: {a.reasoning!r} vs {b.reasoning!r}"
        elif a.text != b.text:
            ta, tb = tokenizer.encode(a.text), tokenizer.encode(b.text)
            k = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            report.first_difference = f"turn {i}, reply token {k}: {a.text!r} vs {b.text!r}"
    return report


def run_parity(model: str | None, on_status: Callable[[str], None] = lambda _: None,
               ranks: Ranks | None = None) -> ParityReport:
    """The 3-turn greedy conversation in this process, then through a launched mlx_lm.server (on
    ``ranks``, a sharded one): the same prompts and the same tokens?"""
    from localchat.backends.mlx_options import RuntimeOptions
    from localchat.backends.openai_http import backend_for

    ref = resolve(model or DEFAULT_MODEL)
    on_status(f"loading {ref.id} in-process …")
    inproc = load_inproc_or_vision(ref, local_dir(ref), cache_reuse=True, options=RuntimeOptions())
    inproc_results = play(inproc, ref)
    server = start_ready(ref, port=free_port(), on_poll=on_status, ranks=ranks)
    try:
        backend = backend_for(server.base_url, ref)
        try:
            server_results = play(backend, ref)
        finally:
            backend.close()
    finally:
        server.stop()
    return compare(ref.id, inproc_results, server_results, getattr(inproc, "tokenizer", None))
