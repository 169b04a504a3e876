"""The front's relay thread gives way to the engines' decode, and nothing it starts inherits that; a
guard run by hand stops nothing of the group it was started in."""

import os
import subprocess
import sys
import threading

import pytest

from localchat.processes import child_preexec, yield_to_compute

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="scheduling policies are Linux's")
POLICY = [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"]


def in_a_relay_thread(work):
    """``work()`` run in a thread that called ``yield_to_compute``, and what it returned."""
    seen = {}

    def relay():
        seen["yielded"] = yield_to_compute()
        seen["policy"] = os.sched_getscheduler(0)
        seen["result"] = work()

    thread = threading.Thread(target=relay)
    thread.start()
    thread.join(60)
    return seen


def policy_of_a_child(**popen) -> int:
    return int(subprocess.run(POLICY, capture_output=True, text=True, timeout=60, **popen).stdout)


def test_only_the_calling_thread_yields_and_localchats_children_go_back_to_the_normal_policy():
    seen = in_a_relay_thread(lambda: (policy_of_a_child(preexec_fn=child_preexec()), policy_of_a_child()))
    assert seen["yielded"] and seen["policy"] == os.SCHED_BATCH
    started_by_localchat, started_bare = seen["result"]
    assert started_by_localchat == os.SCHED_OTHER
    assert started_bare == os.SCHED_BATCH  # (what the reset is for: a child inherits its thread's policy)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # (this thread, and so the rest of the process, unchanged)


def test_an_mcp_servers_guard_puts_its_server_back_on_the_normal_policy():
    guard = [sys.executable, "-m", "localchat.mcp.guard", *POLICY]  # (a session's leader, as the MCP SDK starts it)
    seen = in_a_relay_thread(lambda: subprocess.run(guard, capture_output=True, text=True, timeout=60,
                                                    start_new_session=True))
    assert seen["result"].returncode == 0, seen["result"].stderr
    assert int(seen["result"].stdout) == os.SCHED_OTHER


def test_a_guard_that_does_not_lead_its_group_leaves_the_others_in_it_alone():
    """Run by hand from a shell, the guard is a member of the shell's group: what it stops when its
    server ends is what is below it, never the shell (which, here, says it survived)."""
    shell = f"{sys.executable} -m localchat.mcp.guard {sys.executable} -c pass; echo survived"
    done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=60,
                          start_new_session=True)  # (a group of this test's own: the shell leads it)
    assert done.stdout.strip() == "survived", (done.returncode, done.stderr)
