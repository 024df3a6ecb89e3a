"""The test suite keeps its temporary directories under $TMPDIR and leaves none behind (issue 19
item 6). A sample of tests that make every kind the suite makes (pytest's tmp_path, the fixtures'
short socket directories, daemons and emulators writing in them) runs in a pytest subprocess whose
$TMPDIR is a directory of this test's own; an audit hook in it records every directory it makes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kubesim.scratch import scratch_dir

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = (
    "tests/e2e/test_api_errors.py",  # the workdir fixture, a daemon, both emulators
    "tests/kube/test_api.py::test_pod_annotation_patch_merges_and_removes",  # tmp_path
    "tests/test_grpc_roundtrip.py::test_register",  # serve()'s socket directory
    "tests/sim/test_kubelet.py::test_register_reads_plugin_options_and_records_both",  # plugin_dir
    "tests/sim/test_kubelet_podresources.py::test_eleventh_immediate_call_is_rejected",  # root
    "tests/plugin/test_service.py::test_options_and_socket_mode",  # served
)
MARK = "directories made: "
# pytest in a process that reports the directories it made outside the repository (its
# __pycache__ directories are no temporary ones).
CHILD = f"""
import json, os, sys, pytest
made = []
def audit(event, args):
    if event == "os.mkdir":
        path = os.path.abspath(os.fsdecode(args[0]))
        if not path.startswith({str(ROOT) + os.sep!r}):
            made.append(path)
sys.addaudithook(audit)
code = pytest.main(sys.argv[1:])
print({MARK!r} + json.dumps(made))
sys.exit(code)
"""


def test_a_test_run_makes_its_directories_under_tmpdir_and_removes_them() -> None:
    with scratch_dir("tmp-") as tmpdir:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, "-q", "-p", "no:cacheprovider", *SAMPLE],
            cwd=ROOT,
            env={**os.environ, "TMPDIR": str(tmpdir)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"{len(SAMPLE)} passed" in done.stdout, done.stdout[-3000:]
        made = json.loads(done.stdout.rsplit(MARK, 1)[1])
        assert made, "the audit hook saw no directory made"
        assert [path for path in made if not path.startswith(str(tmpdir) + os.sep)] == []
        assert sorted(str(p.relative_to(tmpdir)) for p in tmpdir.rglob("*")) == []
