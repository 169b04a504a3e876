"""bench tells a real difference from noise: intervals on its figures once there are repeats, the
paired test of history on vs off, the conditions of the run, and ``bench compare``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localchat.bench.script import SCRIPTS_DIR
from localchat.cli.app import app

runner = CliRunner()
RECALL = ["--script", str(SCRIPTS_DIR / "recall-en.yaml")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two repeats with seed 0, the same again (the same draws), and two with seed 1 (other draws)."""
    out = {}
    for name, seed in (("a", "0"), ("same", "0"), ("other", "1")):
        path = tmp_path_factory.mktemp(name)
        done = runner.invoke(app, ["bench", *RECALL, "--repeat", "2", "--seed", seed, "--out", str(path)])
        assert done.exit_code == 0, done.stderr
        out[name] = (path, done.stdout)
    return out


def test_repeats_give_intervals_and_the_paired_test_of_history(runs):
    path, shown = runs["a"]
    data = json.loads((path / "results.json").read_text())
    assert data["schema"] == "localchat.bench.arms/2"
    paired = data["summary"]["history_on_vs_off"]["inproc"]["paired"]
    accuracy = paired["accuracy_difference"]
    assert accuracy["low"] > 0 and accuracy["value"] > 0.3 and paired["mcnemar_p"] < 0.05
    assert "history on vs off: accuracy +" in shown and "(McNemar p " in shown and "points [+" in shown
    interval = data["summary"]["intervals"]["inproc history-on"]["ttft_median_s"]
    assert interval["low"] <= interval["value"] <= interval["high"]
    conditions = data["environment"]["conditions"]
    assert set(conditions) == {"start", "end"} and conditions["start"]["cores"] >= 1
    assert "thermal" in conditions["start"]


def test_one_repeat_says_no_interval_can_be_given_and_how_many_would():
    done = runner.invoke(app, ["bench", *RECALL, "--format", "json"])
    data = json.loads(done.stdout)
    assert "--repeat 5 gives 95 % intervals" in data["summary"]["no_interval"]
    assert data["summary"]["history_on_vs_off"]["inproc"]["paired"]["accuracy_difference"]["low"] is None


def test_compare_pairs_runs_of_the_same_draws_and_calls_no_seed_change_different(runs):
    same = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(runs["same"][0]), "--json"])
    report = json.loads(same.stdout)
    arm = report["arms"]["inproc history-on"]
    assert same.exit_code == 0 and arm["paired"] and arm["b_vs_a"]["discordant_turns"] == 0
    other = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(runs["other"][0])])
    assert other.exit_code == 0 and "different draws: run against run" in other.stdout, other.stderr
    accuracy = json.loads(runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(runs["other"][0]),
                                              "--json"]).stdout)["arms"]["inproc history-on"]["b_vs_a"]
    assert accuracy["accuracy_difference"]["low"] <= 0 <= accuracy["accuracy_difference"]["high"]


def test_compare_refuses_runs_of_other_scripts_or_temperature_unless_forced(runs, tmp_path):
    changed = json.loads((runs["other"][0] / "results.json").read_text())
    changed["environment"]["temperature"] = 0.7
    (tmp_path / "results.json").write_text(json.dumps(changed))
    refused = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(tmp_path)])
    assert refused.exit_code == 2 and "temperature: 0.0 vs 0.7" in refused.stderr and "--force" in refused.stderr
    assert runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(tmp_path), "--force"]).exit_code == 0
    (tmp_path / "results.json").write_text("{}")
    bad = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(tmp_path)])
    assert bad.exit_code == 2 and "not a bench results.json" in bad.stderr


@pytest.mark.parametrize("turns, needle", [
    ([{"arm": "a", "script": "s", "repeat": 0}], "turn 1: user must be str"),
    ([1], "turn 1 is not an object"),
    ("many", "not a bench results.json"),
])
def test_compare_refuses_a_damaged_results_file_in_one_line(runs, tmp_path, turns, needle):
    (tmp_path / "results.json").write_text(json.dumps({"schema": "localchat.bench.arms/2", "turns": turns}))
    refused = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(tmp_path), "--force"])
    assert refused.exit_code == 2 and needle in refused.stderr and "Traceback" not in refused.stderr, refused.stderr


def test_compare_names_an_arm_only_one_run_has(runs, tmp_path):
    saved = json.loads((runs["a"][0] / "results.json").read_text())
    first = saved["turns"][0]["arm"]
    renamed = dict(saved, turns=[dict(t, arm="extra") if t["arm"] == first else t for t in saved["turns"]])
    (tmp_path / "results.json").write_text(json.dumps(renamed))
    shown = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(tmp_path), "--force"])
    assert shown.exit_code == 0, shown.stderr
    assert f"{first}: only in run A" in shown.stdout and "extra: only in run B" in shown.stdout


def test_a_damaged_results_file_under_a_directory_with_braces_is_one_line(runs, tmp_path):
    damaged = tmp_path / "{x}"
    damaged.mkdir()
    (damaged / "results.json").write_text(json.dumps({"schema": "localchat.bench.arms/2", "turns": [
        {"arm": "a", "script": "s", "repeat": 0}]}))
    refused = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(damaged), "--force"])
    assert refused.exit_code == 2 and "{x}" in refused.stderr and "user must be str" in refused.stderr, refused.stderr


def test_compare_refuses_wrong_types_and_non_finite_figures(runs, tmp_path):
    saved = json.loads((runs["a"][0] / "results.json").read_text())
    for field, value, needle in (("ttft_s", "fast", "ttft_s must be"), ("correct", "yes", "correct must be"),
                                 ("prompt_tokens", True, "prompt_tokens must be")):
        damaged = dict(saved, turns=[dict(saved["turns"][0], **{field: value}), *saved["turns"][1:]])
        (tmp_path / "results.json").write_text(json.dumps(damaged))
        refused = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(tmp_path)])
        assert refused.exit_code == 2 and needle in refused.stderr, refused.stderr
    nan = dict(saved, turns=[dict(saved["turns"][0], ttft_s=float("nan")), *saved["turns"][1:]])
    (tmp_path / "results.json").write_text(json.dumps(nan))  # Python writes NaN, which its reader takes
    refused = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(tmp_path)])
    assert refused.exit_code == 2 and "not nan" in refused.stderr, refused.stderr


@pytest.mark.parametrize("change, needle", [
    (lambda s: s["turns"][0].update(prompt_tokens=10**400), "prompt_tokens must be"),
    (lambda s: s["turns"][0].update(conversation=-(10**400)), "conversation must be"),
    (lambda s: s["turns"][0].update(total_s=10**400), "total_s must be"),
    (lambda s: s["environment"].update(conditions="busy"), "environment.conditions must"),
    (lambda s: s["environment"].update(conditions={"start": [1, 2]}), "environment.conditions must"),
    (lambda s: s["environment"].update(conditions={"start": {"load_1m": "high", "cores": 2}}),
     "environment.conditions must"),
    (lambda s: s["environment"].update(conditions={"start": {"load_1m": 1.0, "cores": 10**401}}),
     "environment.conditions must"),
])
def test_compare_refuses_counts_past_any_run_and_conditions_of_the_wrong_type(runs, tmp_path, change, needle):
    saved = json.loads((runs["a"][0] / "results.json").read_text())
    change(saved)
    (tmp_path / "results.json").write_text(json.dumps(saved))
    refused = runner.invoke(app, ["bench", "compare", str(runs["a"][0]), str(tmp_path), "--force"])
    assert refused.exit_code == 2 and needle in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
