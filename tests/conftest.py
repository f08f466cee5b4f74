"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest

from tests.helpers import Install, fresh_install


@pytest.fixture(scope="session")
def run_install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """A clean copy of the checkout with what `make run` installs, and nothing more."""
    return fresh_install(tmp_path_factory.mktemp("run-install"), "run")


@pytest.fixture(scope="session")
def demo_install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """A clean copy of the checkout with what `make demo` installs, and nothing more."""
    return fresh_install(tmp_path_factory.mktemp("demo-install"), "demo")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup` xdist groups tests by a suffix it writes into each node id: a pytest
    that ignores it would run a group's tests side by side, silently."""
    if getattr(config.option, "loadgroup", False):
        lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
        if lost:
            raise pytest.UsageError(f"xdist_group has no effect with pytest {pytest.__version__} ({lost[0]}): "
                                    "install the pytest that pyproject.toml's test extra names")
