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
