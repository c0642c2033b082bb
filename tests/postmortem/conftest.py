"""Post-mortem test helpers: the fixtures folder and the rule pack, loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufix.rules.loader import load_ruleset
from gpufix.rules.model import RuleSet

PM_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "postmortem"


@pytest.fixture(scope="session")
def ruleset() -> RuleSet:
    return load_ruleset(use_cache=False)
