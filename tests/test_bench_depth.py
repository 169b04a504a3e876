"""``bench --depth``: a turn with d tokens of conversation already in the context, prefilled whole
and from the cache, in both backends (its shape only: timings are the benchmark's to judge)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from localchat.cli.app import app

runner = CliRunner()


def test_the_depth_sweep_builds_each_context_and_measures_it_uncached_then_cached(tmp_path):
    done = runner.invoke(app, ["bench", "--depth", "0,256,512", "--repeat", "2", "--backend", "both",
                               "--format", "json", "--out", str(tmp_path)])
    assert done.exit_code == 0, done.stderr
    data = json.loads(done.stdout)
    points = data["depth"]
    assert len(points) == 3 * 2 * 2 * 2  # depths × repeats × backends × (uncached, cached)
    for p in points:
        assert p["context_tokens"] >= p["depth"] and p["status"] != "error", p
        assert p["ttft_s"] is not None or p["status"] == "empty", p  # only a reply with no text has no TTFT
        if p["kind"] == "uncached":
            assert p["cached_tokens"] < 12  # only the template's opening: every point has its own prefix
        elif p["depth"]:
            assert p["cached_tokens"] >= p["context_tokens"]  # the whole conversation came from the cache
    sweep = data["summary"]["depth"]
    assert set(sweep) == {"inproc uncached", "inproc cached", "server uncached", "server cached"}
    assert all(s["growth_ms_per_1k"] is not None and len(s["points"]) == 3 for s in sweep.values())
    assert all(p["ttft_s"]["low"] is not None for s in sweep.values() for p in s["points"])  # two repeats
    assert "--depth 0,256,512" in data["environment"]["command"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| inproc cached | 512 |" in summary and "ms per 1,000 tokens of context" in summary


def test_a_depth_past_the_window_or_beside_policies_is_one_line():
    past = runner.invoke(app, ["bench", "--depth", "0,900"])
    assert past.exit_code == 2 and "the model's window of 1024 tokens" in past.stderr
    both = runner.invoke(app, ["bench", "--depth", "0,256", "--policy", "full,window:4"])
    assert both.exit_code == 2 and "--depth measures one thing" in both.stderr
    bad = runner.invoke(app, ["bench", "--depth", "a,b"])
    assert bad.exit_code == 2 and "token counts" in bad.stderr


def test_recall_by_distance_shows_where_a_window_forgets():
    done = runner.invoke(app, ["bench", "--distance", "0,4", "--policy", "full,window:2", "--repeat", "2",
                               "--format", "json"])
    assert done.exit_code == 0, done.stderr
    data = json.loads(done.stdout)
    sweep = data["summary"]["distance"]
    assert set(sweep) == {"inproc full", "inproc window:2"}
    by_k = {arm: {row["distance"]: row for row in rows} for arm, rows in sweep.items()}
    assert by_k["inproc window:2"][4]["correct"] == 0  # the code left the window two turns after it was told
    assert by_k["inproc full"][0]["correct"] == by_k["inproc full"][0]["asked"] == 2
    assert all(row["accuracy"]["low"] is not None for rows in sweep.values() for row in rows)
    assert {t["script"] for t in data["turns"]} == {"distance-0", "distance-4"}
    versus = data["summary"]["policy_vs_full"]["inproc window:2"]  # a policy against full, turn by turn
    assert versus["accuracy_difference"]["value"] < 0 and versus["discordant_turns"] >= 2
    assert "--distance 0,4" in data["environment"]["command"]
    refused = runner.invoke(app, ["bench", "--distance", "0,99"])
    assert refused.exit_code == 2 and "from 0 to 64" in refused.stderr
