"""The YAML engine's public surface is pinned: changing it is a deliberate act."""

from __future__ import annotations

import kernel.policy.yaml as yaml_engine


def test_yaml_engine_exports_are_pinned() -> None:
    assert sorted(yaml_engine.__all__) == [
        "MAX_BUNDLE_BYTES",
        "MAX_RULES",
        "MAX_YAML_NODES",
        "RuleTrace",
        "YamlBundle",
        "compile_yaml_bundle",
    ]
