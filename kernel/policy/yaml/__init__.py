"""The YAML rule engine (rebuno-v0.md §3): compiled at load, evaluated as a pure first-match loop."""

from kernel.policy.yaml.compiler import (
    MAX_BUNDLE_BYTES,
    MAX_RULES,
    MAX_YAML_NODES,
    compile_yaml_bundle,
)
from kernel.policy.yaml.engine import YamlBundle
from kernel.policy.yaml.rule import RuleTrace

__all__ = [
    "MAX_BUNDLE_BYTES",
    "MAX_RULES",
    "MAX_YAML_NODES",
    "RuleTrace",
    "YamlBundle",
    "compile_yaml_bundle",
]
