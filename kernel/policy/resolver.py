"""The resolver: agent → active bundle revision → decision. Compiled once per revision, cached;
no bundle → permissive; any fault → deny `bundle-error` (fail closed). Never raises."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from kernel.domain import Decision, PolicyInput, Verdict
from kernel.domain.decision import PolicyKind
from kernel.store import SqlStore

log = logging.getLogger("kernel.policy")


class CompiledBundle(Protocol):
    revision: str

    def evaluate(self, inp: PolicyInput) -> Decision: ...


Compiler = Callable[[str, str], CompiledBundle]  # (content, revision) → compiled


def yaml_revision(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def compile_yaml(content: str, revision: str) -> CompiledBundle:
    from kernel.policy.yaml import compile_yaml_bundle

    return compile_yaml_bundle(content, revision=revision)


class BundleResolver:
    """Reads the agent's active revision (one indexed lookup) and evaluates its compiled bundle."""

    def __init__(self, store: SqlStore, compilers: dict[str, Compiler] | None = None):
        self.store = store
        self.compilers: dict[str, Compiler] = compilers or {"yaml": compile_yaml}
        self._cache: dict[tuple[str, int], CompiledBundle | Exception] = {}
        self._lock = threading.Lock()

    def decide(self, inp: PolicyInput) -> Decision:
        try:
            with self.store.read() as tx:
                row = tx.active_policy(inp.agent_id)
                agent = None if row is not None else tx.get_agent(inp.agent_id)
        except Exception:
            log.exception("policy lookup failed for agent %s", inp.agent_id)
            return Decision.bundle_error("agent_lookup_failed")
        if row is None:
            if agent is None:
                return Decision.bundle_error("agent_lookup_failed")
            return Decision.permissive()
        kind = PolicyKind(row.kind) if row.kind in PolicyKind._value2member_map_ else PolicyKind.NONE
        bundle = self._compiled(row)
        if isinstance(bundle, Exception):
            return Decision.bundle_error("policy_bundle_invalid", kind, row.revision)
        try:
            return bundle.evaluate(inp)
        except Exception:
            log.exception("policy evaluation failed (agent %s, revision %s)", inp.agent_id, row.revision)
            return Decision(Verdict.DENY, "eval-error", "policy evaluation failed",
                            policy_kind=kind, policy_revision=row.revision)

    def _compiled(self, row: Any) -> CompiledBundle | Exception:
        key = (row.agent_id, int(row.id))
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        compiler = self.compilers.get(row.kind)
        result: CompiledBundle | Exception
        if compiler is None:
            result = LookupError(f"no engine for bundle kind {row.kind!r}")
        else:
            try:
                result = compiler(row.content, row.revision)
            except Exception as exc:  # a stored bundle that no longer compiles: fail closed
                log.error("stored bundle for agent %s (revision %s) does not compile: %s",
                          row.agent_id, row.revision, exc)
                result = exc
        with self._lock:
            # Keep only the newest compiled revision per agent.
            for k in [k for k in self._cache if k[0] == row.agent_id]:
                del self._cache[k]
            self._cache[key] = result
        return result
