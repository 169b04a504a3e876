"""The command line: single-prompt mode, piping, and every bad input as one line + exit code."""

import pytest
from typer.testing import CliRunner

from localchat.cli.app import app

runner = CliRunner()


def one_error_line(result) -> str:
    assert "Traceback" not in result.output + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error:", "Error:"))]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_single_prompt_prints_only_the_answer_on_stdout():
    result = runner.invoke(app, ["chat", "Remember the code harbor 17. Reply only OK."])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "OK\n"
    assert "[TTFT" in result.stderr and "in " in result.stderr


def test_single_prompt_reads_stdin_with_dash():
    result = runner.invoke(app, ["chat", "-", "--no-stats"], input="请记住代号「港口 17」，只回答「收到」。")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "收到\n"
    assert "[TTFT" not in result.stderr


def test_single_prompt_rejects_no_history():
    result = runner.invoke(app, ["chat", "--no-history", "hi"])
    assert result.exit_code == 2
    assert "--no-history" in one_error_line(result)


@pytest.mark.parametrize("args, exit_code, needle", [
    (["chat", "   "], 2, "empty input"),
    (["chat", "--max-input-chars", "5", "too long input"], 2, "over the limit of 5"),
    (["chat", "--temperature", "-1", "hi"], 2, "--temperature"),
    (["chat", "--max-tokens", "0", "hi"], 2, "--max-tokens"),
    (["chat", "--top-p", "2", "hi"], 2, "--top-p"),
    (["chat", "-m", "no-such-model", "hi"], 2, "unknown model 'no-such-model'"),
    (["chat", "-m", "a" * 5000, "hi"], 2, "unknown model '" + "a" * 80 + "…'"),  # longer than a file name may be
    (["chat", "-m", " ", "hi"], 2, "the model name is empty"),
    (["pull", ""], 2, "the model name is empty"),
    (["rm", "demo"], 2, "neither pulled nor imported (bundled: "),
    (["chat", "-m", "./no/such/dir", "hi"], 1, "does not exist"),
    (["chat", "-m", "mlx-community/Not-Cached-4bit", "hi"], 1, "localchat pull mlx-community/Not-Cached-4bit"),
])
def test_bad_input_is_one_line_and_a_nonzero_exit(args, exit_code, needle):
    result = runner.invoke(app, args)
    assert result.exit_code == exit_code, result.output + result.stderr
    assert needle in one_error_line(result)


def test_server_down_is_one_error_line_without_a_figures_line():
    """No token ever came: there is no TTFT or rate to show, only what went wrong."""
    result = runner.invoke(app, ["chat", "--backend", "server", "--base-url", "http://127.0.0.1:9/v1", "hi"])
    assert result.exit_code == 1 and result.stdout == ""
    assert "nothing is listening there" in one_error_line(result)
    assert "[TTFT" not in result.stderr


def test_a_directory_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    result = runner.invoke(app, ["chat", "-m", str(tmp_path), "hi"])
    assert result.exit_code == 1
    assert "not an MLX model directory" in one_error_line(result)


def test_invalid_utf8_on_stdin():
    result = runner.invoke(app, ["chat", "-"], input=b"caf\xe9 \xff")
    assert result.exit_code == 2
    assert "not valid UTF-8" in one_error_line(result)


@pytest.mark.parametrize("yaml_text, needle", [
    ("models:\n  - id: demo\n    source: bundled:demo_model\n    defaults: {temperature: hot}\n",
     "entry 1 (demo): field 'defaults.temperature'"),
    ("models:\n  - id: a\n    source: x/y\n  - id: b\n    sorce: x/z\n", "entry 2 (b): unknown field 'sorce'"),
    ("models:\n  - id: a\n    source: [unclosed\n", "line"),
    ("models:\n  - {id: a, source: x/y}\n  - {id: b, source: x/z, aliases: [a]}\n", "already used"),
    ("models: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deep to read"),
])
def test_malformed_models_yaml_names_entry_and_field(tmp_path, monkeypatch, yaml_text, needle):
    bad = tmp_path / "models.yaml"
    bad.write_text(yaml_text)
    monkeypatch.setenv("LOCALCHAT_MODELS", str(bad))
    result = runner.invoke(app, ["chat", "hi"])
    assert result.exit_code == 1
    assert needle in one_error_line(result)


def test_models_lists_the_bundled_demo_as_present():
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("demo (default, tiny) · demo family · present · ") and " · 4-bit · needs ~" in lines[0]
    assert lines[0].endswith(" at 1,024 tokens: fits")  # the demo's window, and this machine's memory
    assert "qwen3-4b · qwen3 family · not on this machine · localchat pull qwen3-4b" in lines
    assert "  mlx-community/Qwen3-4B-4bit (variants: 4bit, 8bit, bf16)" in lines


@pytest.mark.parametrize("command", [["models"], ["doctor", "--base-url", "http://127.0.0.1:9/v1"]])
def test_model_ids_and_sources_are_whole_at_80_columns(monkeypatch, command):
    """What a user types (ids, aliases, sources) is never cut or wrapped inside the text."""
    from localchat.registry import load_registry

    monkeypatch.setenv("COLUMNS", "80")
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    for entry in load_registry():
        assert any(line.startswith(entry.id + " ") for line in lines), entry.id
        assert any(line == f"  {entry.source}" or line.startswith(f"  {entry.source} (variants: ")
                   for line in lines), entry.source
    assert "…" not in result.stdout


def test_doctor_is_honest_about_the_cpu():
    result = runner.invoke(app, ["doctor", "--base-url", "http://127.0.0.1:9/v1"])
    assert result.exit_code == 0, result.stderr
    assert "not Apple Silicon" in result.stdout and "cpu (Metal not available)" in result.stdout
    assert "nothing answers" in result.stdout


@pytest.mark.parametrize("content", ["log: [oops\n", "nonsense: 1\n", "- a list\n", "memory_limit: lots\n"])
def test_doctor_reports_a_bad_config_file_with_its_path_rather_than_refusing(tmp_path, monkeypatch, content):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    (tmp_path / "config.yaml").write_text(content)
    result = runner.invoke(app, ["doctor", "--base-url", "http://127.0.0.1:9/v1"])
    assert result.exit_code == 1 and "Traceback" not in result.stdout + result.stderr
    shown = " ".join(result.stdout.split())
    assert "config.yaml" in shown and ("NOT READ" in shown or "memory" in shown), result.stdout
    assert "mlx / mlx-lm" in result.stdout  # the rest of the diagnosis is still there


@pytest.mark.parametrize("command, says, never", [
    (["serve"], "The model to serve", "--backend server"),
    (["parity"], "The model to serve", "--backend server"),
    (["smoke"], "The model to ask the server for", "--backend server"),
    (["load"], "demo with --launch", "--backend server"),
    (["bench"], "The model to benchmark", "--backend server"),
    (["chat"], "with --backend server, the server's own model", "<float>"),
])
def test_each_commands_model_help_says_what_that_command_does_with_it(command, says, never):
    text = runner.invoke(app, [*command, "--help"]).stdout
    shown = " ".join(text.split())
    options = [line for line in text.splitlines() if line.lstrip().startswith("-")]
    assert says in shown and never not in shown
    assert not [line for line in options if "<list[" in line or "<int range>" in line or "<str>" in line]


def test_serve_port_has_help_and_unattended_runs_never_say_a_terminal_asks():
    serve = " ".join(runner.invoke(app, ["serve", "--help"]).stdout.split())
    assert "--port PORT Port to listen on." in serve
    for command in ("bench", "load"):
        shown = " ".join(runner.invoke(app, [command, "--help"]).stdout.split())
        assert "required with --tools: nobody is asked here" in shown and "terminal asks" not in shown
    assert "--script PATH" in " ".join(runner.invoke(app, ["bench", "--help"]).stdout.split())


def test_a_server_that_is_not_there_names_the_port_to_serve_on():
    from localchat.server.launch import free_port

    done = runner.invoke(app, ["chat", "--backend", "server", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "Hi"])
    port = done.stderr.split("127.0.0.1:")[1].split("/")[0]
    assert done.exit_code == 1 and f"localchat serve --port {port}" in done.stderr


def test_version_names_localchat_and_mlx():
    import re

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and re.fullmatch(r"localchat \S+ \(mlx \S+, mlx-lm \S+\)\n", result.stdout)


def test_bench_help_shows_the_usage_a_user_types():
    for args in (["bench", "--help"], ["bench", "run", "--help"]):
        shown = runner.invoke(app, args).stdout
        assert shown.startswith("Usage: localchat bench [OPTIONS]"), shown[:80]


def test_the_removal_prompts_say_what_to_type(monkeypatch):
    """``[y/N]`` is shown as it is (Rich would take it for markup and drop it)."""
    import io

    from rich.console import Console

    from localchat.cli.remove import confirm

    shown = io.StringIO()
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt="": (shown.write(prompt), "n")[1])
    assert confirm(Console(file=shown, force_terminal=False), "smollm2 at /x", 10, yes=False) is False
    assert "[y/N]" in shown.getvalue()
