"""The rule pack: YAML rule files, their strict schema, loading (with a compiled cache) and self-tests."""

from gpufix.rules.model import CATEGORIES, GPU_CATEGORIES, Rule, RuleSet

__all__ = ["CATEGORIES", "GPU_CATEGORIES", "Rule", "RuleSet"]
