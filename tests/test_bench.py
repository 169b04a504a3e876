"""`localchat bench` on the demo model: what history buys and costs, outputs, bad input."""

import csv
import json

import pytest
from typer.testing import CliRunner

from localchat.bench.script import SCRIPTS_DIR
from localchat.cli.app import app

runner = CliRunner()
SCRIPTS = SCRIPTS_DIR
RECALL = ["--script", str(SCRIPTS / "recall-en.yaml"), "--script", str(SCRIPTS / "recall-zh.yaml")]
REFUSALS = {"I don't know.", "不知道。"}


def bench(*args) -> dict:
    result = runner.invoke(app, ["bench", "--format", "json", *args])
    assert result.exit_code == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def inproc_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    data = bench(*RECALL, "--script", str(SCRIPTS / "long-chat.yaml"), "--repeat", "2",
                 "--no-cache-reuse", "--out", str(out))
    return data, out


def arm_turns(data, arm, script=None):
    return [t for t in data["turns"] if t["arm"] == arm and (script is None or t["script"] == script)]


def test_history_buys_recall_and_its_absence_gives_the_refusal(inproc_run):
    data, _ = inproc_run
    on = [t for t in arm_turns(data, "inproc history-on") if t["scored"] and t["script"].startswith("recall")]
    off = [t for t in arm_turns(data, "inproc history-off") if t["scored"] and t["script"].startswith("recall")]
    recalls_on = [t for t in on if t["expected"] not in ("OK", "收到")]
    recalls_off = [t for t in off if t["expected"] not in ("OK", "收到")]
    assert len(recalls_on) == len(recalls_off) == 16
    assert sum(t["correct"] for t in recalls_on) / 16 >= 0.95
    assert sum(t["correct"] for t in recalls_off) / 16 <= 0.05
    assert {t["answer"] for t in recalls_off} <= REFUSALS
    assert [t["expected"] for t in recalls_on] == [t["expected"] for t in recalls_off]  # same codes


def test_prompt_tokens_grow_superlinearly_with_history_and_stay_flat_without(inproc_run):
    data, _ = inproc_run
    on = [t["prompt_tokens"] for t in arm_turns(data, "inproc history-on", "long-chat") if t["repeat"] == 0]
    off = [t["prompt_tokens"] for t in arm_turns(data, "inproc history-off", "long-chat") if t["repeat"] == 0]
    assert len(on) == 14 and all(b > a for a, b in zip(on, on[1:]))
    cumulative = [sum(on[:n]) for n in range(1, len(on) + 1)]
    assert cumulative[-1] > 1.5 * len(on) * on[0]  # total grows faster than N × first turn
    growth_off = data["summary"]["growth"]["inproc history-off"]
    assert max(off) < on[-1] / 3  # each request holds one question, whatever the turn
    growth = data["summary"]["growth"]["inproc history-on"]
    assert abs(growth_off["T"]) < 0.1 * growth["T"]
    assert growth["T"] > 5 and growth["r2"] > 0.9
    assert growth["longest_turns"] == 14 and growth["measured_total"] == sum(on)
    assert abs(growth["model_total"] - growth["measured_total"]) / growth["measured_total"] < 0.1


def test_kv_reuse_caches_from_turn_two_and_no_reuse_caches_nothing(inproc_run):
    data, _ = inproc_run
    reuse = arm_turns(data, "inproc history-on")
    assert all(t["cached_tokens"] > 0 for t in reuse if t["turn"] >= 2)
    assert all(t["cached_tokens"] == 0 for t in arm_turns(data, "inproc history-on no-reuse"))
    assert not any(t["cache_miss"] for t in reuse)
    saving = data["summary"]["kv_reuse"]["inproc"]
    assert saving["prefilled_tokens_saved"] > 0 and saving["prefilled_ratio"] < 0.5


def test_files_parse_and_agree(inproc_run):
    data, out = inproc_run
    saved = json.loads((out / "results.json").read_text())
    assert saved["turns"] == data["turns"] and saved["schema"] == "localchat.bench.arms/2"
    rows = list(csv.DictReader((out / "turns.csv").open()))
    assert len(rows) == len(data["turns"])
    assert [r["answer"] for r in rows] == [t["answer"] for t in data["turns"]]
    assert [int(r["prompt_tokens"]) for r in rows] == [t["prompt_tokens"] for t in data["turns"]]
    md = (out / "summary.md").read_text()
    for arm, s in data["summary"]["arms"].items():
        interval = data["summary"]["intervals"][arm]["accuracy"]  # two repeats: with its 95 % interval
        assert f"| {arm} | {s['accuracy']:.0%} ({s['correct']}/{s['scored']}) " \
               f"[{interval['low']:.0%}, {interval['high']:.0%}] |" in md
    command = data["environment"]["command"]
    assert command.startswith("localchat bench --model demo") and "--no-cache-reuse" in command
    assert "--repeat 2" in command and f"    {command}" in md


def test_environment_block_is_honest_here(inproc_run):
    env = inproc_run[0]["environment"]
    assert env["mlx_device"] == "cpu" and env["apple_silicon"] is False
    assert "Apple" not in env["hardware"] and "CPU" in env["hardware"]
    assert env["model"] == "demo" and env["quantization_bits"] == 4 and env["chat_template_sha256"]
    assert (env["temperature"], env["seed"], env["max_tokens"]) == (0.0, 0, 64)
    for key in ("mlx_version", "mlx_lm_version", "localchat_version", "date", "chip", "os"):
        assert env[key]


def test_same_seed_same_texts_and_fixed_turns_repeat_identically():
    """Reproducibility only; whether the answers are right is test_demo_model's business."""
    first = bench("--script", str(SCRIPTS / "notes-zh.yaml"), "--repeat", "2", "--history", "on")
    second = bench("--script", str(SCRIPTS / "notes-zh.yaml"), "--repeat", "2", "--history", "on")
    assert [t["answer"] for t in first["turns"]] == [t["answer"] for t in second["turns"]]
    fixed = [t for t in first["turns"] if t["conversation"] == 0]  # no variables in conversation 1
    by_repeat = {r: [t["answer"] for t in fixed if t["repeat"] == r] for r in (0, 1)}
    assert by_repeat[0] == by_repeat[1] and len(by_repeat[0]) == len(fixed) // 2 > 0


def test_server_backend_arm_recalls_with_history():
    data = bench("--backend", "server", *RECALL)
    on = [t for t in arm_turns(data, "server history-on") if t["scored"] and t["expected"] not in ("OK", "收到")]
    off = [t for t in arm_turns(data, "server history-off") if t["scored"] and t["expected"] not in ("OK", "收到")]
    assert sum(t["correct"] for t in on) / len(on) >= 0.95
    assert sum(t["correct"] for t in off) / len(off) <= 0.05
    assert all(not t["estimated"] for t in data["turns"])


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    ("conversations:\n  - turns:\n    - user: [unclosed\n", "started at line 3"),
    ("conversations:\n  - turns:\n      - {user: hi, score: true}\n", "needs 'expect' or 'expect_regex'"),
    ("conversations:\n  - turns:\n      - {user: 'say {nope}'}\n", "unknown variable {nope}"),
])
def test_bad_scripts_are_one_line_errors(tmp_path, content, needle):
    path = tmp_path / "script.yaml"
    if content is not None:
        path.write_text(content)
    result = runner.invoke(app, ["bench", "--script", str(path)])
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and needle in errors[0] and "Traceback" not in result.output


def test_repeat_zero_is_a_usage_error():
    result = runner.invoke(app, ["bench", "--repeat", "0"])
    assert result.exit_code == 2 and "--repeat" in result.stderr


def test_unreachable_server_is_one_line():
    from localchat.server.launch import free_port

    result = runner.invoke(app, ["bench", "--backend", "server", "--base-url",
                                 f"http://127.0.0.1:{free_port()}/v1", *RECALL])
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "cannot connect" in errors[0]


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = runner.invoke(app, ["bench", *RECALL, "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 2 and "--extra plot" in result.stderr


def test_benchmark_models_tell_their_tokenizer_their_context_length(rambling_model):
    """Not the demo tokenizer's 1024: a long benchmark prompt must not be flagged as too long."""
    from transformers import AutoTokenizer

    context = json.loads((rambling_model / "config.json").read_text())["max_position_embeddings"]
    tokenizer = AutoTokenizer.from_pretrained(str(rambling_model))
    assert context > 1024 and tokenizer.model_max_length == context


@pytest.mark.parametrize("columns", ["80", "200"])
def test_the_table_never_cuts_an_arm_or_a_figure(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    result = runner.invoke(app, ["bench", "--script", str(SCRIPTS / "recall-en.yaml"), "--no-cache-reuse"])
    assert result.exit_code == 0, result.stderr
    table = result.stdout.split("inproc: history on vs off")[0]
    assert "…" not in table
    for arm in ("inproc history-on", "inproc history-on no-reuse", "inproc history-off"):
        assert any(line.strip().startswith(arm) for line in table.splitlines()), arm
    assert ("\n  accuracy " in table) == (columns == "80")  # one block an arm when the table does not fit
