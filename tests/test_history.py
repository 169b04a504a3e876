"""The one history builder and the Conversation's accept/trim rules (pure logic)."""

import pytest

from localchat.conversation.history import Conversation, Turn, build_messages, validate_input
from localchat.errors import UsageError


def test_history_sits_between_system_and_question():
    history = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    messages = build_messages("q2", "SYS", history)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert [m["content"] for m in messages] == ["SYS", "q1", "a1", "q2"]


def test_system_message_appears_once_and_empty_system_means_none():
    conv = Conversation("SYS")
    for i in range(3):
        conv.commit(Turn(f"q{i}", f"a{i}"))
    assert [m["role"] for m in conv.preview("next")].count("system") == 1
    assert build_messages("q", None)[0] == {"role": "user", "content": "q"}
    assert build_messages("q", "")[0]["role"] == "user"


def test_backend_receives_a_copy():
    conv = Conversation("SYS")
    conv.commit(Turn("q1", "a1"))
    sent = conv.preview("q2")
    sent[1]["content"] = "tampered"
    sent.append({"role": "user", "content": "extra"})
    assert conv.messages()[1]["content"] == "q1"
    assert len(conv.messages()) == 3


def test_preview_never_mutates_and_reset_keeps_system():
    conv = Conversation("SYS")
    conv.commit(Turn("q1", "a1"))
    conv.commit(Turn("q2", "a2"))
    assert len(conv.messages()) == 5
    assert len(conv.preview("q3")) == 6
    assert len(conv.messages()) == 5
    conv.reset()
    assert conv.messages() == [{"role": "system", "content": "SYS"}]
    assert len(conv.preview("q3")) == 2


def test_trim_by_turns_drops_oldest_whole_turns_only_at_commit():
    conv = Conversation("SYS")
    for i in range(5):
        conv.commit(Turn(f"q{i}", f"a{i}"))
    drop = conv.plan_trim("new", max_turns=2)
    assert drop == 3
    assert [m["content"] for m in conv.preview("new", drop=drop)] == ["SYS", "q3", "a3", "q4", "a4", "new"]
    assert len(conv.turns) == 5  # a failed turn would leave everything in place
    conv.commit(Turn("new", "reply"), drop)
    assert [t.user for t in conv.turns] == ["q3", "q4", "new"]


def test_trim_by_tokens_never_splits_a_turn_nor_drops_system():
    conv = Conversation("SYS")
    for i in range(6):
        conv.commit(Turn(f"question {i}", f"answer {i}"))

    def count_words(messages):
        return sum(len(m["content"].split()) for m in messages)

    drop = conv.plan_trim("last one", max_tokens=12, count_tokens=count_words)
    kept = conv.preview("last one", drop=drop)
    assert count_words(kept) <= 12
    assert kept[0]["role"] == "system"
    roles = [m["role"] for m in kept[1:-1]]
    assert roles == ["user", "assistant"] * (len(roles) // 2)
    assert drop == 4


def test_input_that_cannot_fit_is_refused():
    conv = Conversation("SYS")
    with pytest.raises(UsageError, match="max-context-tokens"):
        conv.plan_trim("x " * 50, max_tokens=10, count_tokens=lambda ms: sum(len(m["content"]) for m in ms))


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_input_is_refused(text):
    with pytest.raises(UsageError, match="empty"):
        validate_input(text)


def test_input_over_the_limit_is_refused():
    validate_input("x" * 10, max_chars=10)
    with pytest.raises(UsageError, match="over the limit of 10"):
        validate_input("x" * 11, max_chars=10)
