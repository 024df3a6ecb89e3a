"""Move the emulators out of the product package (issue 14 item 2): `deviceplugin/sim` becomes the
top-level package `kubesim` of its own distribution, `deviceplugin-emulators` (emulators/), which
the product's wheel and image neither contain nor import.

Re-runnable on any checkout of main, from the repository root:

    python scripts/split_emulators.py

1. `git mv deviceplugin/sim emulators/kubesim` (skipped once done);
2. every tracked text file: the module `deviceplugin.sim` becomes `kubesim` and the path
   `deviceplugin/sim` becomes `emulators/kubesim` (nothing else is touched);
3. the hand-made part, scripts/split_emulators.patch (the emulators' pyproject, the product's
   dependencies and install extra, the Makefile, the lazy `simulate` import and its message, the
   tests that keep the split), applied with `git apply --3way` unless already applied;
4. `ruff check --select I --fix` on the files that import kubesim: the renamed imports sorted where
   they now belong (with the patch's `src` setting, `kubesim` is first-party).
Everything it changes is staged; commit it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLD_DIR, NEW_DIR = "deviceplugin/sim", "emulators/kubesim"
PATCH = Path("scripts/split_emulators.patch")
CREATED = "emulators/pyproject.toml"
# This script and its patch name the old paths on purpose.
SKIP = {Path("scripts/split_emulators.py"), PATCH}
RENAMES = ((re.compile(r"\bdeviceplugin\.sim\b"), "kubesim"), (re.compile(r"\bdeviceplugin/sim\b"), NEW_DIR))


def git(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=check)


def move() -> None:
    old, new = ROOT / OLD_DIR, ROOT / NEW_DIR
    if not old.exists():
        print(f"{OLD_DIR}: already moved")
        return
    if new.exists():
        sys.exit(f"both {OLD_DIR} and {NEW_DIR} exist: move what is left by hand")
    new.parent.mkdir(exist_ok=True)
    git("mv", OLD_DIR, NEW_DIR)
    print(f"moved {OLD_DIR} -> {NEW_DIR}")


def rewrite() -> None:
    """The files rewritten are staged (step 3 applies to the index)."""
    changed = []
    for name in git("ls-files", "-z").stdout.split("\0"):
        path = Path(name)
        if not name or path in SKIP or not (ROOT / path).is_file():
            continue
        try:
            text = (ROOT / path).read_text()
        except UnicodeDecodeError:  # binary
            continue
        new = text
        for pattern, replacement in RENAMES:
            new = pattern.sub(replacement, new)
        if new != text:
            (ROOT / path).write_text(new)
            changed.append(name)
    if changed:
        git("add", "--", *changed)
        print(f"rewrote {len(changed)} files")


def apply_patch() -> None:
    # The emulators' pyproject is the patch's own new file: once there, the patch was applied (with
    # any conflicts resolved by hand since).
    if (ROOT / CREATED).exists():
        print(f"{PATCH}: already applied ({CREATED} exists)")
        return
    done = git("apply", "--3way", str(PATCH), check=False)
    if done.returncode != 0:
        sys.exit(
            f"{done.stderr}\n{PATCH} applied with conflicts: resolve them (git status lists them), "
            "git add the files and run this script again"
        )
    print(f"applied {PATCH}")


def sort_imports() -> None:
    python = git("grep", "-l", "-E", r"^\s*(from|import) kubesim", "--", "*.py", check=False).stdout.split()
    if not python:
        return
    ruff = ROOT / ".venv" / "bin" / "ruff"
    command = str(ruff) if ruff.exists() else shutil.which("ruff") or sys.exit("no ruff: make .venv first")
    subprocess.run([command, "check", "--quiet", "--select", "I", "--fix", *python], cwd=ROOT, check=False)
    git("add", "--", *python)


def main() -> None:
    move()
    rewrite()
    apply_patch()
    sort_imports()


if __name__ == "__main__":
    main()
