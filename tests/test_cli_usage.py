"""Every sub-command's `--help`, and what a mistyped flag shows (issue 19 item 6)."""

from __future__ import annotations

import argparse

import pytest

from deviceplugin.cli import build_parser, main


def command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command the parser knows, nested ones included (`sim kubelet`), found from the parser
    itself so that one added later is covered."""
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += command_paths(sub, (*path, name))
    return found


PATHS = command_paths(build_parser())
LEAVES = [path for path in PATHS if not any(other[: len(path)] == path and other != path for other in PATHS)]


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(stopped.value.code or 0), out, err


def test_the_nested_commands_are_found() -> None:
    assert {("run",), ("sim", "kubelet"), ("sim", "apiserver"), ("inspect",)} <= set(PATHS)


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(path) or "deviceplugin")
def test_every_commands_help_works(capsys: pytest.CaptureFixture[str], path: tuple[str, ...]) -> None:
    """Issue 19: `deviceplugin run --help` crashed on a `%` in a help string."""
    code, out, err = run_main(capsys, *path, "--help")
    assert (code, err) == (0, "")
    assert out.startswith(" ".join(("usage: deviceplugin", *path)))


def test_a_percent_sign_in_an_options_help_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "run", "--help")
    assert code == 0
    assert "up to 20% less" in " ".join(out.split())  # --vgpu-handshake-interval's help, as written


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_an_unknown_flag_shows_that_commands_usage(
    capsys: pytest.CaptureFixture[str], path: tuple[str, ...]
) -> None:
    """Issue 19: `deviceplugin run --bogus` printed the top-level usage (`deviceplugin [-h] [--version]
    COMMAND ...`), which lists none of run's options."""
    required = ["--dir", "/nowhere"] if path == ("sim", "kubelet") else []
    code, _, err = run_main(capsys, *path, *required, "--no-such-flag")
    assert code == 2
    lines = err.splitlines()
    assert lines[0].startswith(" ".join(("usage: deviceplugin", *path))), err
    assert lines[-1] == f"deviceplugin {' '.join(path)}: error: unrecognized arguments: --no-such-flag"


def test_a_bad_value_shows_that_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "sim", "apiserver", "--port", "eighty")
    assert code == 2
    assert err.startswith("usage: deviceplugin sim apiserver"), err
    assert "argument --port: invalid int value: 'eighty'" in err
