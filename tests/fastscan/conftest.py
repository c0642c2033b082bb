from __future__ import annotations

import pytest

from gpufix.rules.loader import load_ruleset


@pytest.fixture(scope="session")
def pack():
    return load_ruleset(use_cache=False)
