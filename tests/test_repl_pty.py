"""The real REPL in a pseudo-terminal on the demo model (pexpect), as a user types it."""

import sys

import pexpect
import pytest

PROMPT = ">>> "


def spawn(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "localchat", "chat", *args], encoding="utf-8",
                          timeout=60, dimensions=(40, 200), env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                                                  "TERM": "dumb"})
    child.expect_exact(PROMPT)
    return child


def quit(child: pexpect.spawn) -> None:
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_remembers_with_history():
    child = spawn()
    child.sendline("Remember the code harbor 17. Reply only OK.")
    child.expect_exact("OK")
    child.expect_exact("[TTFT")
    child.expect_exact(PROMPT)
    child.sendline("What was the code? Reply with the code only.")
    child.expect_exact("harbor 17", timeout=20)
    child.expect_exact(PROMPT)
    quit(child)


def test_forgets_without_history():
    child = spawn("--no-history")
    child.sendline("Remember the code harbor 17. Reply only OK.")
    child.expect_exact("OK")
    child.expect_exact(PROMPT)
    child.sendline("What was the code? Reply with the code only.")
    child.expect_exact("I don't know.", timeout=20)
    child.expect_exact(PROMPT)
    quit(child)


def test_multiline_input_between_triple_quotes():
    child = spawn("--system", "")
    child.sendline('"""')
    child.sendline("Remember the code harbor 17.")
    child.sendline("Reply only OK.")
    child.sendline('"""')
    child.expect_exact("[TTFT")
    child.expect_exact(PROMPT)
    child.sendline("/history")
    child.expect(r"history: (\d) messages")
    assert child.match.group(1) == "2"  # the two lines went as one message, and the greedy reply "OK" was kept
    child.expect_exact("user: Remember the code harbor 17.\r\nReply only OK.")
    quit(child)


def test_ctrl_c_mid_reply_discards_the_turn(rambling_model):
    child = spawn("-m", str(rambling_model), "--system", "", "--max-tokens", "3000")
    child.sendline("hello")
    child.expect(r"[\s\S]{40}")  # the reply is streaming
    child.sendintr()
    child.expect_exact("interrupted")
    child.expect_exact(PROMPT)
    child.sendline("/history")
    child.expect_exact("history: 0 messages")
    child.expect_exact(PROMPT)
    child.sendintr()  # Ctrl+C at the prompt leaves cleanly
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.parametrize("line", ["/bogus", ""])
def test_unknown_command_and_empty_line_send_nothing(line):
    child = spawn()
    child.sendline(line)
    if line:
        child.expect_exact("unknown command")
    child.sendline("/stats")
    child.expect_exact("turns 0")
    quit(child)
