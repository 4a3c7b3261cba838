"""The examples in the package's docstrings, run where they live."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import claude_proxy

MODULES = sorted(info.name for info in pkgutil.walk_packages(claude_proxy.__path__,
                                                             "claude_proxy."))


@pytest.mark.parametrize("name", [m for m in MODULES if ">>>" in (
    importlib.util.find_spec(m).loader.get_source(m) or "")])  # type: ignore[union-attr]
def test_docstring_examples(name: str) -> None:
    failed, tried = doctest.testmod(importlib.import_module(name), verbose=False)
    assert tried > 0
    assert failed == 0
