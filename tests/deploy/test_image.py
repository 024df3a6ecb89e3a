"""The image recipe: pinned runtime dependencies that cover the project's own, a multi-stage build
from python:3.11-slim, a non-root default user, and a build context holding only what it copies;
the product's wheel, built from that context, holds no emulator, and the image no dependency of
theirs alone."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.deploy.manifests import IMAGE, ROOT

DOCKERFILE = ROOT / "Dockerfile"
REQUIREMENTS = ROOT / "deploy" / "requirements.txt"


def pins() -> dict[str, Version]:
    pinned: dict[str, Version] = {}
    for raw in REQUIREMENTS.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"{REQUIREMENTS.name}: not an exact pin: {line!r}"
        name = canonicalize_name(match[1])
        assert name not in pinned, f"{name} pinned twice"
        pinned[name] = Version(match[2])
    return pinned


def project_dependencies(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


def test_every_project_dependency_is_pinned_within_its_range() -> None:
    pinned = pins()
    for requirement in project_dependencies():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is a dependency but not pinned"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{name}=={pinned[name]} is outside pyproject's {requirement}"
        )


def _requires(name: str) -> list[Requirement]:
    return [
        requirement
        for text in metadata.requires(name) or []
        if (requirement := Requirement(text)).marker is None
        or requirement.marker.evaluate({"extra": "", "python_version": "3.11"})
    ]


def test_pins_are_closed_under_their_dependencies() -> None:
    """What pip would pull in besides the pins: checked against the installed metadata of every
    pinned package installed here at its pinned version (the development venv, when in step)."""
    pinned, checked, missing = pins(), 0, []
    for name, version in pinned.items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        if installed != version:
            continue
        checked += 1
        for requirement in _requires(name):
            wanted = canonicalize_name(requirement.name)
            if wanted not in pinned:
                missing.append(f"{name} needs {requirement}")
            elif not requirement.specifier.contains(pinned[wanted], prereleases=True):
                missing.append(f"{name} needs {requirement}, pinned {pinned[wanted]}")
    if checked == 0:
        pytest.skip("no pinned package is installed at its pinned version here")
    assert missing == []


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines if line and not line.startswith("#"))
    ]


def test_dockerfile_builds_in_stages_and_runs_deviceplugin() -> None:
    steps = _instructions()
    bases = [rest for word, rest in steps if word == "FROM"]
    assert bases == ["python:3.11-slim AS builder", "python:3.11-slim"]
    runtime = steps[[word for word, _ in steps].index("FROM", 1) :]  # the final stage
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in env
    assert ("USER", "65532:65532") in runtime
    assert ("ENTRYPOINT", '["deviceplugin"]') in runtime
    assert ("CMD", '["run"]') in runtime  # an upstream DaemonSet without args runs the daemon
    install = " ".join(rest for word, rest in runtime if word == "RUN")
    assert "--no-index" in install and "--no-deps" in install and "requirements.txt" in install
    assert f"docker build -t {IMAGE} ." in DOCKERFILE.read_text()


def test_build_context_holds_what_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"  # everything out, then what the build needs back in
    allowed = {pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")}
    copied = set()
    for word, rest in _instructions():
        if word == "COPY" and "--from" not in rest:
            *sources, _destination = rest.split()
            copied |= {source.rstrip("/") for source in sources}
    assert copied == allowed


def _build_context() -> list[str]:
    """What the Dockerfile copies from the build context (its COPY sources)."""
    return [
        source
        for word, rest in _instructions()
        if word == "COPY" and "--from" not in rest
        for source in rest.split()[:-1]
    ]


def test_the_product_wheel_holds_no_emulator(tmp_path: Path) -> None:
    """Built as the image's builder stage builds it, from a copy of the files it copies."""
    context = tmp_path / "context"
    for source in _build_context():
        (context / source).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / source).is_dir():  # less what .dockerignore keeps out
            shutil.copytree(ROOT / source, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / source, context / source)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    done = subprocess.run(
        [*pip_wheel, "--wheel-dir", str(tmp_path / "out"), str(context)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "out").glob("deviceplugin-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (info,) = {name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")}
        requires = Parser().parsestr(archive.read(f"{info}/METADATA").decode()).get_all("Requires-Dist")
    assert "deviceplugin/cli.py" in names and "deviceplugin/fit/__init__.py" in names
    assert sorted({name.split("/")[0] for name in names} - {info}) == ["deviceplugin"]
    assert [name for name in names if "kubesim" in name] == []
    # The emulators are only an extra's requirement; what they alone need is not the product's.
    unconditional = {canonicalize_name(Requirement(text).name) for text in requires or [] if ";" not in text}
    assert unconditional == {canonicalize_name(r.name) for r in project_dependencies()}
    assert not unconditional & {"jsonpatch", "jsonpointer", "deviceplugin-emulators"}


def test_the_image_installs_nothing_only_the_emulators_need() -> None:
    product = {canonicalize_name(r.name) for r in project_dependencies()}
    emulators_only = (
        {canonicalize_name(r.name) for r in project_dependencies(ROOT / "emulators" / "pyproject.toml")}
        - product
        - {"deviceplugin"}
    )
    assert {"jsonpatch", "jsonpointer"} <= emulators_only
    assert sorted(emulators_only & set(pins())) == []
