"""`regent bench --scenarios policy-authoring`: what typed YAML predicates and the Rego probes cost
normal decisions. The YAML and Rego decision p50 are measured side by side in one run on this
checkout and on the baseline (main just before those landed, extracted with `git archive`), in
alternating child processes, on the same bundles and inputs; goal: within 5 %.

The child imports `kernel` from the tree it is given (its working directory comes first on
sys.path), so each side runs its own YAML engine, RegoEngine, pool and worker script.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# "policy: typed YAML predicates … an instrumented twin per bundle" (0147893) holds every change
# this work made to the decision path; the commit before it is the baseline. Comparing the two
# isolates it from whatever else landed since; this checkout is measured beside them too.
CHANGE = os.environ.get("REGENT_BENCH_AUTHORING_CHANGE", "0147893")
BASELINE = os.environ.get("REGENT_BENCH_AUTHORING_BASELINE", CHANGE + "^")

_CHILD = r"""
import json, sys, time
from kernel.domain import PolicyInput
from kernel.policy.yaml import compile_yaml_bundle
n_yaml, n_rego = int(sys.argv[1]), int(sys.argv[2])
spec = json.loads(sys.stdin.read())
out = {"kernel": __import__("kernel").__file__}
def p50(fn, n):
    for _ in range(min(n, 500)):
        fn()
    samples = []
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock(); fn(); samples.append(clock() - t0)
    samples.sort()
    return samples[n // 2]
for label, text, inp in spec["yaml"]:
    try:
        bundle = compile_yaml_bundle(text, revision="bench")
    except Exception as exc:  # the baseline has no typed predicates
        out[label] = None
        continue
    pi = PolicyInput(**inp)
    out[label] = p50(lambda: bundle.evaluate(pi), n_yaml)
import logging, os
logging.disable(logging.WARNING)
from kernel.policy.rego import RegoEngine, parse_rego_bundle
def cpu(pids):  # this process and the workers, user + system seconds
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
with RegoEngine(size=1) as engine:
    for label, mapping, inp in spec["rego"]:
        bundle = parse_rego_bundle(mapping)
        pi = PolicyInput(**inp)
        engine.evaluate(bundle, pi)
        c0 = cpu(engine.worker_pids())
        out[label] = p50(lambda: engine.evaluate(bundle, pi), n_rego)
        out[label + " (CPU)"] = (cpu(engine.worker_pids()) - c0) / (n_rego + min(n_rego, 500))
print(json.dumps(out))
"""


def _spec() -> dict[str, Any]:
    from kernel.policy.rego.bench import BENCH_BUNDLE

    payments_strings = (ROOT / "bundles" / "payments.yaml").read_text()
    # The payments bundle with Rebuno's string predicates only, so the baseline can load it.
    payments_strings = payments_strings.replace("{type: string, one_of:", "{one_of:").replace(
        "amount: {type: number, gt: 1000}", "amount: {regex: '^(100[0-9]*[1-9]|10[1-9][0-9]|1[1-9][0-9]{2}|[2-9][0-9]{3}|[0-9]{5,}|[0-9.]+e\\\\+[0-9]+)'}").replace(
        "amount: {type: number, gt: 0, lte: 1000}", "amount: {regex: '^[0-9]'}")
    transfer = {"agent_id": "payments", "kind": "tool_call", "target": "transfer_funds", "args": {"amount": 500}}
    shell = {"agent_id": "a", "kind": "tool_call", "target": "shell_exec", "args": {"command": "ls -la"}}
    one = ("default_action: deny\nrules:\n  - id: r0\n    when: {target: shell_exec, arguments: "
           "{command: {regex: '^ls'}}}\n    then: {decision: allow}\n")
    typed = (ROOT / "bundles" / "payments.yaml").read_text()
    payments_rego = {
        "modules": {"policy.rego": (ROOT / "bundles" / "payments-rego" / "policy.rego").read_text()},
        "data": json.loads((ROOT / "bundles" / "payments-rego" / "data.json").read_text()),
        "manifest": json.loads((ROOT / "bundles" / "payments-rego" / ".manifest").read_text()),
    }
    return {
        "yaml": [
            ["yaml: 1 rule, regex match", one, shell],
            ["yaml: payments, string predicates, transfer", payments_strings, transfer],
            ["yaml: payments, typed predicates, transfer", typed, transfer],
        ],
        "rego": [
            ["rego: bench shell bundle", BENCH_BUNDLE, shell],
            ["rego: payments bundle, transfer", payments_rego, transfer],
        ],
    }


def _tree_at(rev: str, directory: Path) -> Path | None:
    """`kernel/` at ``rev``, or None when this is not a git checkout that has it."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        raw = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "kernel"],
                             capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    with tarfile.open(fileobj=BytesIO(raw)) as tar:
        tar.extractall(directory, filter="data")
    return directory


def _child(tree: Path, spec: dict[str, Any], n_yaml: int, n_rego: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(n_yaml), str(n_rego)], input=json.dumps(spec),
                          capture_output=True, text=True, cwd=tree, env=env, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench child in {tree} exited {proc.returncode}: {proc.stderr[-800:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not str(result["kernel"]).startswith(str(tree)):
        raise RuntimeError(f"bench child in {tree} imported {result['kernel']}")
    return result


def bench_policy_authoring(rounds: int = 3, n_yaml: int = 20_000, n_rego: int = 2_000) -> dict[str, Any]:
    spec = _spec()
    with tempfile.TemporaryDirectory() as tmp:
        base = _tree_at(BASELINE, Path(tmp) / "baseline")
        change = _tree_at(CHANGE, Path(tmp) / "change")
        if base is None or change is None:
            raise RuntimeError(f"no git checkout with {BASELINE} and {CHANGE} to compare")
        trees = {"baseline": base, "change": change, "checkout": ROOT}
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in trees}
        for i in range(rounds):
            order = list(trees)[i % 3:] + list(trees)[: i % 3]  # each side goes first once in three
            for side in order:
                runs[side].append(_child(trees[side], spec, n_yaml, n_rego))
    labels = [row[0] for row in spec["yaml"]] + [row[0] for row in spec["rego"]]
    # The Rego rows' CPU per decision (kernel process and worker together, from /proc): steadier
    # than a wall-clock p50 on a shared machine; the checkout's includes its workers' polling.
    labels += [row[0] + " (CPU)" for row in spec["rego"]]
    out: dict[str, Any] = {"rounds": rounds, "baseline": BASELINE, "change": CHANGE, "rows": []}
    for label in labels:
        row: dict[str, Any] = {"label": label}
        for side in trees:
            got = [r[label] for r in runs[side] if r.get(label) is not None]
            row[f"{side}_p50"] = statistics.median(got) if got else None
        for side in ("change", "checkout"):
            if row[f"{side}_p50"] and row["baseline_p50"]:
                row[f"{side}_ratio"] = row[f"{side}_p50"] / row["baseline_p50"]
        out["rows"].append(row)
    return out
