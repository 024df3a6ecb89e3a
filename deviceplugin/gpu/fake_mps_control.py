#!/usr/bin/env python3
"""A stand-in for `nvidia-cuda-mps-control`, for fake GPUs only (`--mps-control` names it in tests
and simulations; nothing else runs it). Standard library only, so it runs under any python3.

* `fake_mps_control.py -d`: starts a control daemon in the background, as the real one does, for
  `$CUDA_MPS_PIPE_DIRECTORY`: it listens on the pipe directory's `control` socket, writes
  `nvidia-cuda-mps-control.pid` there, and returns once it answers (exit 1 when one already does,
  or when a file `fake-start-fails` beside the pipe directory says why it cannot start).
* `fake_mps_control.py` (no argument): the front end: sends each line of stdin to the daemon and
  prints its answers; exit 1 when no daemon answers ("Cannot find MPS control daemon process").

The daemon keeps `set_default_active_thread_percentage N` and `set_default_device_pinned_mem_limit
DEV VALUE` and answers the matching `get_default_*`; `get_server_list` answers nothing (no CUDA
client ever connects here); `quit` ends it. Every command it receives is appended to
`$CUDA_MPS_LOG_DIRECTORY/control.log`. Killing it (its PID is in the pid file) is a crash.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

CONTROL = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"
REFUSE_FILE = "fake-start-fails"  # beside the pipe directory: `-d` fails with the file's text


def _pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _log_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


def _connect(pipe: Path) -> socket.socket | None:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(pipe / CONTROL))
    except OSError:
        client.close()
        return None
    return client


def _answer(line: str, settings: dict[str, str]) -> str:
    words = line.split()
    if not words:
        return ""
    if words[0] == "set_default_active_thread_percentage" and len(words) == 2:
        settings["active_thread_percentage"] = words[1]
        return words[1]
    if words[0] == "get_default_active_thread_percentage":
        return settings.get("active_thread_percentage", "100.0")
    if words[0] == "set_default_device_pinned_mem_limit" and len(words) == 3:
        settings[f"pinned_mem_limit {words[1]}"] = words[2]
        return ""
    if words[0] == "get_default_device_pinned_mem_limit" and len(words) == 2:
        return settings.get(f"pinned_mem_limit {words[1]}", "0")
    if words[0] == "get_server_list":
        return ""
    return f"unknown command {words[0]}"


def _serve(listener: socket.socket, pipe: Path, log: Path) -> None:
    settings: dict[str, str] = {}
    while True:
        connection, _ = listener.accept()
        with connection:
            try:
                line = connection.makefile("r").readline().strip()
                if not line:
                    continue  # a probe that only connected
                with (log / "control.log").open("a") as record:
                    record.write(line + "\n")
                if line == "quit":
                    (pipe / CONTROL).unlink(missing_ok=True)
                    (pipe / PID_FILE).unlink(missing_ok=True)
                    connection.sendall(b"\n")
                    return
                connection.sendall((_answer(line, settings) + "\n").encode())
            except OSError:
                continue  # the front end went away: the daemon does not


def daemon() -> int:
    pipe, log = _pipe_dir(), _log_dir()
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    refusal = pipe.parent / REFUSE_FILE
    if refusal.exists():  # a test's stand-in for a driver that will not run MPS
        print(f"cannot start: {refusal.read_text().strip()}", file=sys.stderr)
        return 1
    running = _connect(pipe)
    if running is not None:
        running.close()
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    (pipe / CONTROL).unlink(missing_ok=True)  # left by a daemon that was killed
    ready_read, ready_write = os.pipe()
    if os.fork() > 0:
        os.close(ready_write)
        ready = os.read(ready_read, 1)  # the daemon listens (or died trying)
        return 0 if ready == b"1" else 1
    os.close(ready_read)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(pipe / CONTROL))
    listener.listen(16)
    (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
    os.write(ready_write, b"1")
    os.close(ready_write)
    _serve(listener, pipe, log)
    os._exit(0)


def front_end() -> int:
    pipe = _pipe_dir()
    for line in sys.stdin.read().splitlines():
        client = _connect(pipe)
        if client is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        with client:
            client.sendall((line.strip() + "\n").encode())
            sys.stdout.write(client.makefile("r").readline())
    return 0


if __name__ == "__main__":
    sys.exit(daemon() if sys.argv[1:] == ["-d"] else front_end())
