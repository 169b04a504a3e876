"""A guard run by hand stops nothing of the group it was started in."""

import subprocess
import sys


def test_a_guard_that_does_not_lead_its_group_leaves_the_others_in_it_alone():
    """Run by hand from a shell, the guard is a member of the shell's group: what it stops when its
    server ends is what is below it, never the shell (which, here, says it survived)."""
    shell = f"{sys.executable} -m localchat.mcp.guard {sys.executable} -c pass; echo survived"
    done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=60,
                          start_new_session=True)  # (a group of this test's own: the shell leads it)
    assert done.stdout.strip() == "survived", (done.returncode, done.stderr)
