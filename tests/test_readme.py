"""The README's examples run as written: the Python ones and their assertions, and the shell
commands that try the daemon."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from kubesim.scratch import scratch_dir
from tests.kube.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("source", BLOCKS, ids=[f"example-{n + 1}" for n in range(len(BLOCKS))])
def test_readme_example_runs(source: str) -> None:
    exec(compile(source, str(README), "exec"), {})


# --- the shell commands of "Try the daemon without a GPU or a cluster" ----------------------------

TRY_IT = re.search(r"### Try the daemon without a GPU.*?```sh\n(.*?)```", README.read_text(), flags=re.S)
# What the kubelet emulator prints once the daemon has read the Xid (2 GPUs of 10989 MiB, vGPU mode).
UNHEALTHY = (("vgpu-number", 20), ("vgpu-memory", 21978), ("vgpu-cores", 200))
# Loaded by every Python process the commands start ($PYTHONPATH): records, through an audit hook,
# every file or directory it creates or opens for writing, as JSON lines in $AUDIT_LOG.
SITECUSTOMIZE = """
import json, os, sys
_log = os.open(os.environ["AUDIT_LOG"], os.O_WRONLY | os.O_APPEND)
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def _record(event, path):
    if isinstance(path, (str, bytes, os.PathLike)) and os.fsdecode(path) not in (os.devnull, ":memory:"):
        line = json.dumps({"event": event, "path": os.path.abspath(os.fsdecode(path))}) + "\\n"
        os.write(_log, line.encode())
def _audit(event, args):
    if event == "open" and (any(c in (args[1] or "") for c in "wax+") or (args[2] or 0) & _WRITE):
        _record(event, args[0])
    elif event in ("os.mkdir", "sqlite3.connect", "os.mkfifo", "os.symlink"):
        _record(event, args[0])
    elif event in ("os.rename", "os.replace"):
        _record(event, args[1])
sys.addaudithook(_audit)
"""


def listening_addresses(pids: set[int]) -> list[str]:
    """The local addresses of the TCP sockets in LISTEN state held by any of `pids`."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(_address(fields[1]))
    return found


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # /proc shows the address as 32-bit words in host order (little-endian here).
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return f"{ipaddress.ip_address(socket.inet_ntop(family, words))}:{int(port, 16)}"


def group_pids(pgid: int) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    pids.add(int(entry.name))
    return pids


def test_the_try_it_commands_stay_in_a_temp_dir_and_on_localhost(tmp_path: Path) -> None:
    """Issue 19: the commands wrote the ledger under /var/lib, the vGPU hook files under
    /usr/local/vgpu and the fault file in /tmp, so they needed root, and left files behind. Run as
    written (`.venv/bin/...` from the repository), every file they make is in the temp directory
    they make, they listen on localhost only, and they do what the README says: the kubelet
    emulator shows the daemon's registrations and, after the Xid, every device unhealthy."""
    with scratch_dir("readme-") as tmpdir:  # short: sockets go below it
        run_try_it(tmpdir, tmp_path)


def run_try_it(tmpdir: Path, tmp_path: Path) -> None:
    assert TRY_IT is not None
    hooks, audit = tmp_path / "hooks", tmp_path / "audit.jsonl"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    audit.touch()
    output = tmp_path / "output"
    env = {
        **os.environ,
        "TMPDIR": str(tmpdir),
        "PYTHONPATH": str(hooks),
        "AUDIT_LOG": str(audit),
        # Not the default fixed port: two test runs at once would collide. The check below holds
        # whatever it binds; the default's own address is tested with the options.
        "METRICS_ADDRESS": "127.0.0.1:0",
    }
    with output.open("w") as out:
        shell = subprocess.Popen(
            ["bash", "-e", "-c", TRY_IT[1]],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wanted = [f"devices resource=volcano.sh/{name} healthy=0/{count}" for name, count in UNHEALTHY]

        def shown() -> bool:
            return all(line in output.read_text() for line in wanted)

        wait_for(lambda: shown() or shell.poll() not in (None, 0), 60)  # or the commands failed
        assert shown(), output.read_text()
        listening = listening_addresses(group_pids(shell.pid))
        assert listening, output.read_text()  # the daemon's metrics
        assert [a for a in listening if not ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback] == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(30)
    written = {json.loads(line)["path"] for line in audit.read_text().splitlines()}
    outside = sorted(p for p in written if not p.startswith(f"{tmpdir}{os.sep}") and "__pycache__" not in p)
    assert outside == []
    assert any(p.endswith("ledger.db") for p in written)  # the audit saw the daemon's writes
