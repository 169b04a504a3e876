"""The settings a conversation runs with, chosen one way for ``chat`` and the page: given, else kept,
else the model's default, else localchat's (units, in milliseconds)."""

from __future__ import annotations

import pytest

from localchat.chosen_settings import DEFAULT_MAX_TOKENS, chosen_params
from localchat.registry import ModelEntry, ModelRef

WARM = ModelRef(id="warm", location="/nowhere", kind="local",
                entry=ModelEntry(id="warm", source="/nowhere", defaults={"temperature": 0.8, "max_tokens": 64}))


def test_a_given_setting_wins_over_a_kept_one_and_a_kept_one_over_the_models_default():
    kept = {"temperature": 0.3, "top_k": 7}
    assert chosen_params(WARM, {"temperature": 0.5}, kept).temperature == 0.5
    assert chosen_params(WARM, {}, kept).temperature == 0.3
    assert chosen_params(WARM, {}, kept).top_k == 7
    assert chosen_params(WARM, {}, None).temperature == 0.8
    assert chosen_params(WARM, {}, {"temperature": None}).max_tokens == 64
    plain = chosen_params(None, {}, None)
    assert (plain.temperature, plain.top_p, plain.repetition_penalty, plain.max_tokens) == (0.0, 1.0, None,
                                                                                            DEFAULT_MAX_TOKENS)


@pytest.mark.parametrize("damaged", [float("nan"), -1.0, "warm", True, [0.5], 1e309])
def test_a_kept_value_that_is_not_valid_is_passed_over_for_the_models_default(damaged):
    """(a database from another version, or damaged: never a sampler fed NaN)"""
    assert chosen_params(WARM, {}, {"temperature": damaged}).temperature == 0.8
