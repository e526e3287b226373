"""Shadow bundles' engine: compiles each shadow once (by its id) and evaluates it on Rego workers
of its own, so a shadow that loops or crashes never holds a worker the active bundles need.
Never raises: a fault is a deny `bundle-error` or `eval-error`, which the caller counts."""

from __future__ import annotations

import logging
import threading
from typing import Any

from kernel.domain import Decision, PolicyInput, Verdict
from kernel.domain.decision import PolicyKind, ShadowRef
from kernel.policy.resolver import (
    CompiledBundle,
    LazyRegoEngine,
    RegoCompiled,
    compile_yaml,
    parse_rego_content,
)
from kernel.policy.source import BundleSource

log = logging.getLogger("kernel.policy.shadow")

_MAX_COMPILED = 256


class ShadowBundles:
    def __init__(self, store: BundleSource, rego: LazyRegoEngine):
        self.store = store
        self.rego = rego
        self._cache: dict[int, CompiledBundle | Exception] = {}
        self._lock = threading.Lock()

    def evaluate(self, ref: ShadowRef, inp: PolicyInput) -> Decision:
        kind = PolicyKind(ref.kind) if ref.kind in PolicyKind._value2member_map_ else PolicyKind.NONE
        bundle = self._compiled(ref)
        if isinstance(bundle, Exception):
            return Decision.bundle_error(f"policy_bundle_invalid: {bundle}", kind, ref.revision)
        try:
            return bundle.evaluate(inp)
        except Exception:
            log.exception("shadow evaluation failed (agent %s, revision %s)", ref.agent_id, ref.revision)
            return Decision(Verdict.DENY, "eval-error", "shadow evaluation failed", policy_kind=kind,
                            policy_revision=ref.revision)

    def prepare(self, refs: list[ShadowRef]) -> None:
        """Compile the shadows not compiled yet (starting the Rego pool for the first Rego one), so
        that happens when a shadow appears rather than on the first steps it judges."""
        for ref in refs:
            self._compiled(ref)

    def forget_except(self, ids: set[int]) -> None:
        """Drop the compiled copies of shadows that are no longer evaluated."""
        with self._lock:
            for key in [key for key in self._cache if key not in ids]:
                del self._cache[key]

    def close(self) -> None:
        self.rego.close()

    def _compiled(self, ref: ShadowRef) -> CompiledBundle | Exception:
        with self._lock:
            hit = self._cache.get(ref.id)
        if hit is not None:
            return hit
        result: CompiledBundle | Exception
        engine: Any = None
        if ref.kind == "rego":
            try:
                engine = self.rego.get()
            except Exception as exc:  # the pool did not start (say, a saturated host at nice +19):
                log.error("shadow Rego workers did not start (agent %s): %s", ref.agent_id, exc)
                return exc  # not the bundle's fault, so not cached: the next judgement tries again
        try:
            with self.store.read() as tx:
                content = tx.shadow_content(ref.id)
            if content is None:
                raise LookupError(f"shadow {ref.id} vanished")
            if ref.kind == "yaml":
                result = compile_yaml(content, ref.revision)
            elif ref.kind == "rego":
                result = RegoCompiled(parse_rego_content(content), engine)
            else:
                raise LookupError(f"no engine for bundle kind {ref.kind!r}")
        except Exception as exc:
            log.error("shadow bundle for agent %s (revision %s) does not compile: %s", ref.agent_id,
                      ref.revision, exc)
            result = exc
        with self._lock:
            if len(self._cache) >= _MAX_COMPILED:
                self._cache.clear()
            self._cache[ref.id] = result
        return result
