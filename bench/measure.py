"""Runs one benchmark command and measures its peak memory from outside, the same way for
rtrain and for the PyTorch reference: the largest resident set of the process or of any
descendant it waited for (`wait4`'s ru_maxrss; under mpirun, the largest rank).
"""
import os
import subprocess
import tempfile


class Failed(RuntimeError):
    """A benchmark command exited with an error; the message carries its stderr."""


def run(command, env=None):
    """Runs `command`; returns (stdout, peak resident MiB). Raises Failed naming the command."""
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, env=env)
        # Reaped here rather than by Popen.wait, which discards the resource usage.
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    if child.returncode != 0:
        raise Failed(f"{' '.join(map(str, command))} exited with {child.returncode}:\n{err[-4000:]}")
    return out, usage.ru_maxrss / 1024
