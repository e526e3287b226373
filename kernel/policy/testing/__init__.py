"""The policy test runner: case files and Rego unit tests against YAML and Rego bundles; returns
results and never prints (the CLI renders them)."""

from .rego_tests import RegoTestResult, run_rego_test_file
from .runner import LoadedBundle, discover, load_bundle, rego_rule_ids

__all__ = ["LoadedBundle", "RegoTestResult", "discover", "load_bundle", "rego_rule_ids", "run_rego_test_file"]
