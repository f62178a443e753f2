"""Every byte of a long report reaches a terminal under `PYTHONUNBUFFERED=1` while signals
arrive: mpiexec gives ranks a pseudo-terminal as stdout (benchfs.stdio)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import termios
import time

import pytest

REPORT = "".join(f"line {i:05d} {'x' * 70}\n" for i in range(400)).encode()

# A child whose timer signal lands while its write to the terminal waits for a slow reader.
WRITER = """
import signal, sys
signal.signal(signal.SIGALRM, lambda *a: None)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
if sys.argv[1] == "kept":
    from benchfs.stdio import keep_every_byte
    keep_every_byte()
sys.stdout.write("".join(f"line {i:05d} {'x' * 70}\\n" for i in range(400)))
sys.stdout.flush()
signal.setitimer(signal.ITIMER_REAL, 0)
"""


def through_a_slow_terminal(mode: str) -> bytes:
    """What the reader of the child's pseudo-terminal gets, 512 bytes every 2 ms."""
    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR  # as mpiexec sets its ranks' terminals: "\n" stays "\n"
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen([sys.executable, "-c", WRITER, mode], stdout=slave, env=env)
    os.close(slave)
    got = b""
    try:
        while True:
            time.sleep(0.002)
            try:
                chunk = os.read(master, 512)
            except OSError:  # EIO: the writer closed its side and everything was read
                break
            if not chunk:
                break
            got += chunk
    finally:
        os.close(master)
        assert child.wait(timeout=30) == 0
    return got


@pytest.mark.timeout(60)
def test_an_unbuffered_report_keeps_every_byte_through_a_terminal() -> None:
    # The cause, as CPython has it (gh-85393): the plain text layer drops a partial write's rest.
    plain = through_a_slow_terminal("plain")
    assert len(plain) < len(REPORT) and REPORT.startswith(plain), len(plain)
    assert through_a_slow_terminal("kept") == REPORT
