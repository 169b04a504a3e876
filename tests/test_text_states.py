"""Our ``TextStateMachine`` against mlx_lm's own: the same segments, state by state, for the same
text cut into chunks any way (hypothesis), with markers that overlap, repeat, nest and end the
matching; and ``flush``/``discard`` at the end as mlx_lm.server uses them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.generate import TextStateMachine as Theirs

from localchat.backends.text_states import TextStateMachine as Ours

TRANSITIONS = {
    "normal": [("<think>", "reasoning"), ("<tool_call>", "tool"), ("<|end|>", None), ("<th", "short")],
    "reasoning": [("</think>", "normal"), ("</thinkk>", "normal")],
    "tool": [("</tool_call>", "normal")],
    "short": [("ort>", "normal")],
}
PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|end|>", "<th", "ort>", "<", "/", ">", "t", "h",
          "k", "a", " ", "é", "\n", "<thin", "</thi", "</thinkk>"]


def run(machine: type, chunks: list[str], initial: str, end: str) -> list:
    sm = machine(TRANSITIONS)
    state, out = sm.make_state(initial), []
    for chunk in chunks:
        if state[0] is None:  # (a marker that ends the matching: nothing more is split)
            break
        state, segments = sm.split(state, chunk)
        out.append(segments)
    if end == "flush":
        state, held, name = sm.flush(state)
        out.append((held, name))
    else:
        state, name = sm.discard(state)
        out.append(name)
    return out


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.sampled_from(PIECES), max_size=30), cuts=st.lists(st.integers(0, 200), max_size=8),
       initial=st.sampled_from(["normal", "reasoning", "tool", "other"]), end=st.sampled_from(["flush", "discard"]))
def test_ours_splits_as_mlx_lms_does_however_the_text_is_cut(pieces, cuts, initial, end):
    text = "".join(pieces)
    marks = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *marks], [*marks, len(text)])]
    assert run(Ours, chunks, initial, end) == run(Theirs, chunks, initial, end)


def test_a_marker_cut_across_chunks_is_found_and_held_text_let_out_at_the_end():
    sm = Ours({"normal": [("<think>", "reasoning")], "reasoning": [("</think>", "normal")]})
    state = sm.make_state("normal")
    state, first = sm.split(state, "Hi <thi")
    state, second = sm.split(state, "nk>why</th")
    assert first == [("normal", "Hi ")] and second == [("normal", ""), ("reasoning", "why")]
    assert sm.flush(state)[1:] == ("</th", "reasoning")
