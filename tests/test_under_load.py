"""tests/support/under_load.py: the command's exit status comes back, busy loops run during it and are gone after."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "support" / "under_load.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def _busy_loop_pids(stderr: str) -> list[int]:
    line = next(line for line in stderr.splitlines() if "busy loops (pids" in line)
    return [int(pid) for pid in line.split("[", 2)[2].rstrip(")]").split(",")]


@pytest.mark.parametrize(("exit_code", "runs"), [(0, 2), (3, 1)])
def test_the_commands_status_comes_back_and_the_loops_stop(exit_code, runs):
    done = _run("--loops", "2", "--runs", str(runs), "--", sys.executable, "-c", f"import sys; sys.exit({exit_code})")
    assert done.returncode == exit_code, done.stderr
    assert done.stderr.count(f"exited {exit_code}") == runs
    pids = _busy_loop_pids(done.stderr)
    assert len(pids) == 2
    for pid in pids:  # reaped: no such process any more
        assert not Path(f"/proc/{pid}").exists()


def test_the_loops_are_running_while_the_command_runs():
    # The command reads its parent's children from /proc and finds two spinning processes.
    check = (
        "import os, pathlib, sys; ppid = os.getppid(); "
        "kids = [p for p in pathlib.Path('/proc').iterdir() if p.name.isdigit() and "
        "(p / 'stat').exists() and (p / 'stat').read_text().split(') ')[1].split()[1] == str(ppid) "
        "and int(p.name) != os.getpid()]; "
        "sys.exit(0 if len(kids) >= 2 else 1)"
    )
    done = _run("--loops", "2", "--", sys.executable, "-c", check)
    assert done.returncode == 0, done.stderr


def test_without_a_command_it_refuses_with_one_line():
    done = _run("--loops", "1")
    assert done.returncode == 2
    assert "give the command to run after --" in done.stderr
