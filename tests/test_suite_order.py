"""The suite's module order (conftest.MODULE_SECONDS) names modules that exist: a renamed or
removed module would silently drop out of the heaviest-first order."""

from __future__ import annotations

from conftest import MODULE_SECONDS, REPO


def test_every_weighted_module_exists():
    missing = [m for m in MODULE_SECONDS if not (REPO / m).is_file()]
    assert not missing, f"conftest.MODULE_SECONDS names modules that are gone: {missing}; update it"

