#!/usr/bin/env python3
"""Regenerate the committed Python gRPC stubs from the .proto files under proto/.

Every ``proto/<api>/<version>/api.proto`` is compiled with the protoc bundled in
grpcio-tools into ``deviceplugin/api/<api>/<version>/`` (``api_pb2.py``,
``api_pb2_grpc.py``, ``api_pb2.pyi``), together with the empty ``__init__.py``
files that make those directories packages.

The proto tree is mounted under the virtual prefix ``deviceplugin/api`` with
``--proto_path=deviceplugin/api=<repo>/proto``. protoc derives both the output
location and the Python import path of the generated modules from that virtual
name, so the stubs import each other as ``deviceplugin.api.<api>.<version>``
and work inside our package without any post-processing.

Usage: ``python scripts/gen_proto.py`` (or ``make proto``) from anywhere.
"""

from __future__ import annotations

import importlib.resources
import pathlib
import sys

from grpc_tools import protoc

REPO_ROOT: pathlib.Path = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT: pathlib.Path = REPO_ROOT / "proto"
# Virtual directory the proto tree is mapped to; it doubles as the Python package path.
VIRTUAL_PREFIX: str = "deviceplugin/api"
# Suffixes protoc produces for one api.proto with the three outputs requested below.
GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def find_protos(proto_root: pathlib.Path = PROTO_ROOT) -> list[str]:
    """Return the virtual names (``deviceplugin/api/...``) of all .proto files, sorted."""
    return sorted(
        f"{VIRTUAL_PREFIX}/{path.relative_to(proto_root).as_posix()}" for path in proto_root.rglob("*.proto")
    )


def _package_dirs(out_dir: pathlib.Path, virtual_names: list[str]) -> list[pathlib.Path]:
    """Directories below ``out_dir/deviceplugin/api`` that hold generated modules."""
    prefix_dir = out_dir / VIRTUAL_PREFIX
    dirs: set[pathlib.Path] = set()
    for name in virtual_names:
        parent = (out_dir / name).parent
        while parent != prefix_dir:
            dirs.add(parent)
            parent = parent.parent
    return sorted(dirs)


def _remove_stale(out_dir: pathlib.Path, virtual_names: list[str], keep: set[pathlib.Path]) -> None:
    """Delete generated-looking files left over from protos that no longer exist."""
    prefix_dir = out_dir / VIRTUAL_PREFIX
    roots = {
        prefix_dir / pathlib.PurePosixPath(n).relative_to(VIRTUAL_PREFIX).parts[0] for n in virtual_names
    }
    for root in sorted(roots):
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.suffix in (".py", ".pyi") and path not in keep:
                path.unlink()


def generate(out_dir: pathlib.Path, proto_root: pathlib.Path = PROTO_ROOT) -> list[pathlib.Path]:
    """Compile every proto under ``proto_root`` into ``out_dir`` and return the files written.

    ``out_dir`` plays the role of the repository root: the stubs land in
    ``out_dir/deviceplugin/api/...``. The result is sorted and includes the
    ``__init__.py`` files of the generated packages. Output is deterministic.
    """
    virtual_names = find_protos(proto_root)
    if not virtual_names:
        raise RuntimeError(f"no .proto files found under {proto_root}")
    out_dir.mkdir(parents=True, exist_ok=True)

    grpc_tools_include = importlib.resources.files("grpc_tools") / "_proto"
    with importlib.resources.as_file(grpc_tools_include) as include_dir:
        args = [
            "grpc_tools.protoc",
            f"--proto_path={VIRTUAL_PREFIX}={proto_root}",
            f"--proto_path={include_dir}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"--pyi_out={out_dir}",
            *virtual_names,
        ]
        status = protoc.main(args)
    if status != 0:
        raise RuntimeError(f"protoc failed with exit status {status}: {' '.join(args)}")

    written: set[pathlib.Path] = set()
    for package_dir in _package_dirs(out_dir, virtual_names):
        init = package_dir / "__init__.py"
        init.write_bytes(b"")
        written.add(init)
    for name in virtual_names:
        stem = out_dir / name.removesuffix(".proto")
        for suffix in GENERATED_SUFFIXES:
            path = stem.with_name(stem.name + suffix)
            if not path.is_file():
                raise RuntimeError(f"protoc did not produce {path}")
            written.add(path)

    _remove_stale(out_dir, virtual_names, written)
    return sorted(written)


def main() -> int:
    """Regenerate the stubs in place in the repository and list what was written."""
    for path in generate(REPO_ROOT):
        print(path.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
