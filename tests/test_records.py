"""Turn records: the request before the call, the response after it, atomic and owner-only;
a record that cannot be written stops the chat without another model call."""

import json
import os
import stat

import pytest
from typer.testing import CliRunner

from localchat.backends import GenerationParams
from localchat.cli.app import app
from localchat.conversation import records
from localchat.conversation.history import Conversation
from localchat.conversation.records import RecordError, TurnRecorder
from localchat.conversation.turn import ChatSession

runner = CliRunner()
REMEMBER = "Remember the code harbor 17. Reply only OK."


class SpyBackend:
    """The real demo backend, noting which record files existed when each call began."""

    def __init__(self, backend, directory):
        self.backend, self.directory, self.calls = backend, directory, []
        self.name, self.model_id, self.template = backend.name, backend.model_id, backend.template

    def stream(self, messages, params):
        self.calls.append(sorted(p.name for p in self.directory.glob("*.json")) if self.directory.exists() else [])
        return self.backend.stream(messages, params)

    def count_tokens(self, messages, think=None):
        return self.backend.count_tokens(messages, think)

    def context_length(self):
        return self.backend.context_length()

    def close(self):
        pass


def recorded_session(backend, directory):
    return ChatSession(backend, Conversation("You are a helpful assistant."), GenerationParams(max_tokens=32),
                       recorder=TurnRecorder(directory, session_id="s1"))


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_request_is_written_before_the_call_and_response_after(demo_backend, tmp_path):
    directory = tmp_path / "records"
    spy = SpyBackend(demo_backend, directory)
    chat = recorded_session(spy, directory)
    chat.ask(REMEMBER)
    second = chat.ask("Hello")
    assert spy.calls == [["s1-0001-request.json"],
                         ["s1-0001-request.json", "s1-0001-response.json", "s1-0002-request.json"]]
    request = json.loads((directory / "s1-0002-request.json").read_text())
    response = json.loads((directory / "s1-0002-response.json").read_text())
    assert request["id"] == response["id"] == "s1-0002"
    assert request["messages"] == second.messages  # exactly what was sent, history included
    assert [m["role"] for m in request["messages"]] == ["system", "user", "assistant", "user"]
    assert request["mode"] == "history" and request["model"] == "demo" and request["params"]["max_tokens"] == 32
    assert response["text"] == second.text and response["committed"] is True
    assert response["finish_reason"] == "stop" and response["stats"]["prompt_tokens"] > 0


def test_records_are_owner_only_and_leave_no_temporary_files(demo_backend, tmp_path):
    directory = tmp_path / "records"
    recorded_session(demo_backend, directory).ask(REMEMBER)
    assert mode(directory) == 0o700
    files = sorted(directory.iterdir())
    assert [p.name for p in files] == ["s1-0001-request.json", "s1-0001-response.json"]
    assert all(mode(p) == 0o600 for p in files)


def test_no_credentials_in_the_request_record(tmp_path):
    from localchat.backends.openai_http import backend_for

    backend = backend_for("http://127.0.0.1:9/v1", None, name="m", api_key="sk-secret-123")
    chat = recorded_session(backend, tmp_path / "r")
    chat.ask(REMEMBER)  # the connection fails; the request record is there all the same
    text = (tmp_path / "r" / "s1-0001-request.json").read_text()
    assert "sk-secret-123" not in text and json.loads(text)["url"] == "http://127.0.0.1:9/v1"
    assert json.loads((tmp_path / "r" / "s1-0001-response.json").read_text())["committed"] is False


def test_read_only_directory_means_no_model_call(demo_backend, tmp_path, monkeypatch):
    directory = tmp_path / "records"
    directory.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root writes anyway; make the kernel's refusal happen for it too
        real_open = os.open

        def refuse(path, flags, mode=0o777, **kw):
            if str(path).startswith(str(directory)) and flags & os.O_CREAT:
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, flags, mode, **kw)

        monkeypatch.setattr(records.os, "open", refuse)
    spy = SpyBackend(demo_backend, directory)
    chat = recorded_session(spy, directory)
    with pytest.raises(RecordError, match="the model was not called"):
        chat.ask(REMEMBER)
    assert spy.calls == [] and chat.conversation.turns == []


def test_unwritable_request_record_means_no_model_call(demo_backend, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the records directory should be")
    spy = SpyBackend(demo_backend, blocker)
    chat = recorded_session(spy, blocker)
    with pytest.raises(RecordError, match="the model was not called"):
        chat.ask(REMEMBER)
    assert spy.calls == [] and chat.conversation.turns == []
    assert blocker.read_text().startswith("a file")


def test_failed_response_record_stops_without_calling_again(demo_backend, tmp_path, monkeypatch):
    directory = tmp_path / "records"
    spy = SpyBackend(demo_backend, directory)
    chat = recorded_session(spy, directory)
    real_write = records.write_json_atomic

    def failing_write(path, payload):
        if path.name.endswith("-response.json"):
            raise OSError(28, "No space left on device")
        real_write(path, payload)

    monkeypatch.setattr(records, "write_json_atomic", failing_write)
    with pytest.raises(RecordError, match="not called again"):
        chat.ask(REMEMBER)
    assert len(spy.calls) == 1
    assert chat.conversation.turns == []  # history matches the records: no response, no turn
    assert [p.name for p in directory.iterdir()] == ["s1-0001-request.json"]


def test_cli_record_failure_is_one_line_and_exit_1(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    result = runner.invoke(app, ["chat", "--record", str(blocker / "sub"), REMEMBER])
    assert result.exit_code == 1 and result.stdout == ""
    assert "cannot write the request record" in result.stderr and "Traceback" not in result.stderr


def test_preview_and_local_commands_write_nothing(demo_backend, tmp_path):
    from localchat.cli.render import ChatUI
    from localchat.cli.repl import Repl

    directory = tmp_path / "records"
    chat = recorded_session(demo_backend, directory)
    repl = Repl(chat, ChatUI(out=open(os.devnull, "w")))
    for line in ["/preview hello", "/history", "/stats", "/help", "/reset"]:
        repl.handle(line)
    assert not directory.exists()


def test_records_dir_from_the_config_file(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(f"records_dir: {tmp_path / 'from-config'}\n")
    monkeypatch.setenv("LOCALCHAT_HOME", str(home))
    result = runner.invoke(app, ["chat", REMEMBER])
    assert result.exit_code == 0, result.stderr
    assert len(list((tmp_path / "from-config").glob("*-request.json"))) == 1
