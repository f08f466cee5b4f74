"""The wheel installs names of ours alone. PyPI has distributions named common, exporter, report and
remediate: a top-level package of one of those names would overwrite their files, or be overwritten by
them, in an environment that holds both."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.helpers import FOLDERS, ROOT, build_wheel

PREFIX = "gpunode_"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the checkout."""
    scratch = tmp_path_factory.mktemp("wheel")
    return build_wheel(scratch / "source", scratch / "dist")


@pytest.fixture(scope="module")
def wheel(built: Path) -> list[str]:
    """The names of the files in the wheel."""
    with zipfile.ZipFile(built) as archive:
        return archive.namelist()


def not_ours(names: list[str]) -> set[str]:
    """The top-level import names a wheel's files install that are not plainly ours."""
    tops = {name.split("/")[0].removesuffix(".py") for name in names}
    return {top for top in tops if not top.startswith(PREFIX) and not top.endswith((".dist-info", ".data"))}


def test_not_ours_sees_a_foreign_name() -> None:
    assert not_ours(["gpunode_exporter/cli.py", "common/__init__.py", "report.py",
                     "gpunode_exporter-0.1.0.dist-info/RECORD"]) == {"common", "report"}


def test_every_top_level_name_of_the_wheel_is_ours(wheel: list[str]) -> None:
    assert not not_ours(wheel)
    assert {name.split("/")[0] for name in wheel if not name.split("/")[0].endswith(".dist-info")} == set(FOLDERS)


def test_the_wheel_holds_every_module_and_data_file_of_the_source(wheel: list[str]) -> None:
    """pyproject.toml lists the packages one by one (a folder installed under another name cannot be
    found by setuptools' search): a subpackage added and not listed would be missing from the wheel."""
    wanted = {f"{name}/{path.relative_to(ROOT / folder).as_posix()}"
              for name, folder in FOLDERS.items() for path in (ROOT / folder).rglob("*")
              if path.is_file() and "__pycache__" not in path.parts}
    assert wanted - set(wheel) == set()
    assert {"gpunode_rulepack/spec.yaml", "gpunode_exporter/xid/catalog.csv"} <= wanted


def test_the_commands_start_in_our_packages(built: Path, wheel: list[str]) -> None:
    entry_points = next(name for name in wheel if name.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(built) as archive:
        text = archive.read(entry_points).decode()
    targets = dict(tuple(part.strip() for part in line.split("=", 1)) for line in text.splitlines() if "=" in line)
    assert targets == {"gpunode-exporter": "gpunode_exporter.cli:main",
                       "gpunode-remediate": "gpunode_remediate.cli:main"}
