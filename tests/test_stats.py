"""The one clock, the figures line, the ledger and the stored form of a turn's figures, on a fake clock."""

import pytest

from localchat.backends import Finished
from localchat.conversation.stats import (
    STATS_VERSION,
    Ledger,
    TurnClock,
    TurnStats,
    stats_from_dict,
    stats_line,
    stats_to_dict,
)


class FakeClock:
    def __init__(self, *times: float):
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def finished(**kw) -> Finished:
    return Finished(**({"finish_reason": "stop", "prompt_tokens": 100, "completion_tokens": 5} | kw))


def test_ttft_runs_from_submission_to_the_first_text_and_decode_from_first_to_last():
    clock = TurnClock(now=FakeClock(10.0, 10.5, 10.6, 10.7, 10.9, 11.0))
    for text in ("a", "", "b", "c", "d"):  # the empty chunk is not text and reads no time
        clock.on_text(text)
    stats = clock.finish(finished(cached_tokens=60))
    assert stats.ttft_s == pytest.approx(0.5)
    assert stats.decode_tps == pytest.approx(4 / 0.4)  # (5 - 1) tokens between first and last text
    assert stats.prefill_tps == pytest.approx(40 / 0.5)  # only uncached tokens count
    assert stats.total_s == pytest.approx(1.0)
    assert clock.text == "abcd"


def test_a_reply_that_came_in_one_burst_has_no_decode_speed_and_none_is_printed():
    """The gateway's clock once saw the demo's seven tokens within 0.13 ms and printed 46,258
    tok/s: a burst says nothing of how fast the model decoded."""
    burst = [10.0 + i * 20e-6 for i in range(7)]
    clock = TurnClock(now=FakeClock(9.9, *burst, 10.1))
    for text in "abcdefg":
        clock.on_text(text)
    stats = clock.finish(finished(completion_tokens=7))
    assert stats.decode_tps is None and stats.ttft_s == pytest.approx(0.1)
    assert "tok/s" not in stats_line(stats)


def test_tokens_of_an_opening_burst_are_not_counted_in_the_decode_speed():
    """Three chunks together (a stalled reader), then six 50 ms apart: six tokens over 0.3 s,
    not eight; speculative decoding's groups (four tokens a step) count the same way; a reply read
    in two gulps has no rate at all."""
    times = [1.0, 1.00002, 1.00004] + [1.0 + 0.05 * i for i in range(1, 7)]
    clock = TurnClock(now=FakeClock(0.5, *times, 2.0))
    for _ in times:
        clock.on_text("x")
    assert clock.finish(finished(completion_tokens=9)).decode_tps == pytest.approx(6 / 0.3)
    steps = [2.0 + step * 0.1 + k * 1e-5 for step in range(3) for k in range(4)]
    clock = TurnClock(now=FakeClock(1.0, *steps, 3.0))
    for _ in steps:
        clock.on_text("x")
    drafted = clock.finish(finished(completion_tokens=12, draft_tokens=8))  # speculative decoding: groups
    assert drafted.decode_tps == pytest.approx(8 / (steps[-1] - steps[0]))
    gulps = [3.0 + k * 1e-5 for k in range(4)] + [3.002 + k * 1e-5 for k in range(5)]  # a stalled reader, twice
    clock = TurnClock(now=FakeClock(2.9, *gulps, 4.0))
    for _ in gulps:
        clock.on_text("x")
    assert clock.finish(finished(completion_tokens=9)).decode_tps is None  # 2 moments for 9 tokens: not seen


def test_a_turn_that_broke_before_any_text_has_no_ttft_and_no_counts():
    stats = TurnClock(now=FakeClock(1.0, 3.0)).finish(None)
    assert stats.ttft_s is None and stats.decode_tps is None and stats.prompt_tokens == 0
    assert stats.finish_reason is None and stats.total_s == 2.0


def test_one_token_reply_has_no_decode_speed():
    clock = TurnClock(now=FakeClock(0.0, 0.2, 0.3))
    clock.on_text("x")
    assert clock.finish(finished(completion_tokens=1)).decode_tps is None


def test_figures_line_names_every_figure_and_marks_estimates():
    stats = TurnStats(prompt_tokens=274, cached_tokens=256, completion_tokens=52, ttft_s=0.42, decode_tps=41.2,
                      total_s=1.7, peak_memory_gb=0.5, finish_reason="stop", cache_miss_tokens=3)
    assert stats_line(stats) == ("[TTFT 0.42s · 41.2 tok/s · in 274 (cached 256) · out 52 · 1.70s · peak 512 MB · "
                                 "dropped 3 cached]")
    estimated = TurnStats(prompt_tokens=10, completion_tokens=2, total_s=0.5, estimated=True)
    assert stats_line(estimated) == "[TTFT – · in ~10 · out ~2 · 0.50s · estimated counts]"


def test_ledger_sums_and_medians_every_turn():
    ledger = Ledger()
    for ttft, tps, cached in ((0.2, 10.0, 0), (0.4, 20.0, 50), (None, None, 0)):
        ledger.add(TurnStats(prompt_tokens=100, cached_tokens=cached, completion_tokens=5, ttft_s=ttft,
                             decode_tps=tps))
    summary = ledger.summary()
    assert summary["turns"] == 3 and summary["tokens_in"] == 300 and summary["tokens_out"] == 15
    assert summary["cached_share"] == pytest.approx(50 / 300)
    assert summary["ttft_median_s"] == pytest.approx(0.3) and summary["decode_tps_mean"] == pytest.approx(15.0)


def test_stored_figures_round_trip_with_their_version():
    stats = TurnStats(prompt_tokens=9, ttft_s=0.1, finish_reason="stop", runtime={"mlx_lm_prompt_tps": 5.0},
                      cache_break="message 0 (system)", reasoning_cut=True)
    stored = stats_to_dict(stats)
    assert stored["version"] == STATS_VERSION == 7  # 2: ttfa_s, reasoning; 3: budget; 4: drafts; 5: masks; 6: breaks;
    assert stored["reasoning_cut"] is True  # 7: the reasoning cut at the thinking budget
    assert stats_from_dict(stored) == stats


def test_figures_from_another_version_keep_what_fits():
    """Unknown fields are ignored, missing ones take defaults, wrongly typed ones are dropped."""
    stored = {"version": 7, "prompt_tokens": 12, "speculative_tokens": 40, "ttft_s": "fast",
              "estimated": 1, "runtime": {"x": "y"}, "completion_tokens": True, "reasoning_tokens": "many"}
    assert stats_from_dict(stored) == TurnStats(prompt_tokens=12)
    assert stats_from_dict({"version": 1, "prompt_tokens": 3}) == TurnStats(prompt_tokens=3)  # before thinking
    assert stats_from_dict(["not", "a", "mapping"]) is None


def test_an_interrupted_turn_is_counted_apart_and_a_missing_mean_has_no_unit():
    import io

    from rich.console import Console

    from localchat.cli.render import ChatUI
    from localchat.conversation.stats import Ledger, TurnStats

    ledger = Ledger()
    ledger.add(TurnStats(prompt_tokens=10), "interrupted")
    err = io.StringIO()
    ChatUI(out=io.StringIO(), err=Console(file=err, width=200)).ledger(ledger.summary(), None)
    assert "turns 0 (1 more interrupted)" in err.getvalue() and "TTFT mean – median –" in err.getvalue()
