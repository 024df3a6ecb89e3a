"""Fixtures: a kubeconfig for the emulator, and `inspect` run in-process like a user would run it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from deviceplugin.inspect import add_parser, main
from kubesim.apiserver import ApiServerEmulator


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


Inspect = Callable[..., Run]


@pytest.fixture
def kubeconfig(apiserver: ApiServerEmulator, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def inspect(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> Inspect:
    """`deviceplugin inspect ARGS --kubeconfig <emulator>`, through the sub-command parser."""

    def run(*args: str) -> Run:
        parser = argparse.ArgumentParser(prog="deviceplugin")
        add_parser(parser.add_subparsers(dest="command"))
        code = main(parser.parse_args(["inspect", *args, "--kubeconfig", str(kubeconfig)]))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run
