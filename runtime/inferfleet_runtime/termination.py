"""The termination message: where a CLI run as a Kubernetes container leaves its result for the operator."""

from __future__ import annotations

import os
import sys

MAX_BYTES = 4096  # the kubelet keeps at most 4 KiB of a container's termination message


def write_termination_message(text: str) -> None:
    """Writes text to the container's terminationMessagePath (/dev/termination-log, or the file named by
    $INFERFLEET_TERMINATION_LOG), when that file exists: outside a container nothing is written."""
    path = os.environ.get("INFERFLEET_TERMINATION_LOG", "/dev/termination-log")
    if os.path.isfile(path):
        try:
            with open(path, "w") as f:
                f.write(text[:MAX_BYTES])
        except OSError:
            pass  # a read-only or foreign file: the logs still carry the result


def fail(prog: str, message: str, code: int) -> int:
    """Prints `<prog>: error: <message>` to stderr and as the termination message; returns `code`."""
    line = f"{prog}: error: {message}"
    print(line, file=sys.stderr)
    write_termination_message(line)
    return code
