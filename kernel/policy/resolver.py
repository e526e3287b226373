"""The resolver: agent → active bundle revision → decision. Compiled once per revision, cached;
no bundle → permissive; any fault → deny `bundle-error` (fail closed). Never raises."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from kernel.domain import Decision, PolicyInput, Verdict
from kernel.domain.decision import PolicyKind
from kernel.errors import ValidationError, invalid

if TYPE_CHECKING:
    from kernel.policy.source import BundleReads, BundleSource

log = logging.getLogger("kernel.policy")


class CompiledBundle(Protocol):
    revision: str

    def evaluate(self, inp: PolicyInput) -> Decision: ...

    def denied_always(self, agent_id: str, kind: str, target: str) -> bool:
        """Whether every step (agent_id, kind, target) is denied whatever its arguments; True only
        when provably so (a YAML bundle's rule walk), never raises."""
        ...


Compiler = Callable[[str, str], CompiledBundle]  # (content, revision) → compiled


def yaml_revision(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def compile_yaml(content: str, revision: str) -> CompiledBundle:
    from kernel.policy.yaml import compile_yaml_bundle

    return compile_yaml_bundle(content, revision=revision)


class RegoCompiled:
    """A Rego bundle bound to the engine (worker pool) that evaluates it."""

    def __init__(self, bundle: Any, engine: Any):
        self.bundle = bundle
        self.engine = engine
        self.revision = bundle.revision

    def evaluate(self, inp: PolicyInput) -> Decision:
        return self.engine.evaluate(self.bundle, inp)  # type: ignore[no-any-return]

    def evaluate_many(self, inputs: list[PolicyInput]) -> list[Decision]:
        """Each input's decision, in batched worker calls (the policy test runner)."""
        return self.engine.evaluate_many(self.bundle, inputs)  # type: ignore[no-any-return]

    def denied_always(self, agent_id: str, kind: str, target: str) -> bool:
        """Never: regopy has no partial evaluation to prove a deny for every input."""
        return False


class LazyRegoEngine:
    """Starts the Rego worker pool on first use, so kernels without Rego bundles spawn nothing."""

    def __init__(self, size: int = 2, timeout: float = 0.25, acquire_timeout: float = 5.0, nice: int = 0,
                 spin_seconds: float | None = None):
        self.size = size
        self.timeout = timeout
        self.acquire_timeout = acquire_timeout
        self.nice = nice
        self.spin_seconds = spin_seconds  # None: the pool's default
        self._engine: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._engine is None:
                from kernel.policy.rego import RegoEngine
                from kernel.policy.rego.pool import DEFAULT_SPIN_SECONDS

                spin = DEFAULT_SPIN_SECONDS if self.spin_seconds is None else self.spin_seconds
                self._engine = RegoEngine(size=self.size, timeout=self.timeout, acquire_timeout=self.acquire_timeout,
                                          nice=self.nice, spin_seconds=spin)
            return self._engine

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.close()
                self._engine = None

    def stats(self) -> dict[str, Any] | None:
        """The engine's counters and worker figures (`RegoEngine.stats`), or None before first use."""
        engine = self._engine
        return None if engine is None else engine.stats()  # type: ignore[no-any-return]


def parse_rego_content(content: str) -> Any:
    """Stored Rego content is the JSON mapping {modules, data, manifest}."""
    from kernel.policy.rego import parse_rego_bundle

    try:
        mapping = json.loads(content)
    except ValueError as exc:
        raise ValidationError(f"invalid policy bundle: not a JSON bundle: {exc}") from None
    return parse_rego_bundle(mapping)


class BundleResolver:
    """Reads the agent's active revision (one indexed lookup) and evaluates its compiled bundle."""

    def __init__(self, store: BundleSource, compilers: dict[str, Compiler] | None = None,
                 rego: LazyRegoEngine | None = None):
        self.store = store
        self.rego = rego or LazyRegoEngine()
        self.compilers: dict[str, Compiler] = compilers or {"yaml": compile_yaml, "rego": self._compile_rego}
        self._cache: dict[tuple[str, int], CompiledBundle | Exception] = {}
        self._fork_digests: dict[int, str] = {}
        self._lock = threading.Lock()

    def _compile_rego(self, content: str, revision: str) -> CompiledBundle:
        return RegoCompiled(parse_rego_content(content), self.rego.get())

    def check(self, kind: str, content: str) -> str:
        """The load gate: compile a bundle without storing it; returns its revision."""
        if kind == "yaml":
            revision = yaml_revision(content)
            compile_yaml(content, revision)
            return revision
        if kind == "rego":
            from kernel.policy.rego import compile_rego_bundle

            bundle = compile_rego_bundle(parse_rego_content(content), engine=self.rego.get())
            return str(bundle.revision)
        raise invalid(f"unsupported bundle kind {kind!r} (yaml or rego)")

    def close(self) -> None:
        self.rego.close()

    def decide(self, inp: PolicyInput, tx: BundleReads | None = None, bundle_id: int | None = None) -> Decision:
        """`tx`: the submit's own transaction, so the revision is read from the same snapshot as
        the execution (one indexed lookup, no content); without it, a read of its own.
        `bundle_id`: a fork's own bundle, which decides in place of the agent's active one."""
        if bundle_id is not None:
            return self._decide_fork(inp, tx, bundle_id)
        try:
            if tx is not None:
                # The execution was loaded in this snapshot, and it references the agent.
                row = tx.active_policy_ref(inp.agent_id)
                agent_known = True
            else:
                with self.store.read() as own:
                    row = own.active_policy_ref(inp.agent_id)
                    agent_known = row is not None or own.get_agent(inp.agent_id) is not None
        except Exception:
            log.exception("policy lookup failed for agent %s", inp.agent_id)
            return Decision.bundle_error("agent_lookup_failed")
        if row is None:
            if not agent_known:
                return Decision.bundle_error("agent_lookup_failed")
            return Decision.permissive()
        return self._evaluate(inp, row, self._compiled(row, tx), row.content_hash or "",
                              "agent %s, revision %s", (inp.agent_id, row.revision))

    def denied_always(self, agent_id: str, kind: str, targets: list[str]) -> frozenset[str]:
        """The `targets` the agent's active bundle denies whatever the arguments (docs/mcp.md,
        "Hiding denied tools"). Sound, never raises: a YAML bundle answers through its rule walk;
        a Rego bundle never (regopy has no partial evaluation to prove it), nor does no bundle,
        one that does not compile, or a lookup that fails: hiding is presentation, the step's
        own decision is the enforcement."""
        try:
            with self.store.read() as own:
                row = own.active_policy_ref(agent_id)
            if row is None:
                return frozenset()
            bundle = self._compiled(row, None)
            if isinstance(bundle, Exception):
                return frozenset()
            return frozenset(t for t in targets if bundle.denied_always(agent_id, kind, t))
        except Exception:
            log.exception("denied_always: policy lookup failed for agent %s", agent_id)
            return frozenset()

    def _decide_fork(self, inp: PolicyInput, tx: BundleReads | None, bundle_id: int) -> Decision:
        try:
            if tx is not None:
                row = tx.fork_bundle_ref(bundle_id)
            else:
                with self.store.read() as own:
                    row = own.fork_bundle_ref(bundle_id)
        except Exception:
            log.exception("fork bundle %s lookup failed", bundle_id)
            return Decision.bundle_error("fork_bundle_lookup_failed")
        if row is None:
            return Decision.bundle_error("fork_bundle_missing")
        bundle = self._compiled(row, tx, fork=True)
        return self._evaluate(inp, row, bundle, self._fork_digest(bundle_id, tx), "fork bundle %s", (bundle_id,))

    @staticmethod
    def _evaluate(inp: PolicyInput, row: Any, bundle: CompiledBundle | Exception, digest: str,
                  where: str, where_args: tuple[Any, ...]) -> Decision:
        """The decision of a stored bundle (`row`, an agent's active revision or a fork's bundle),
        `digest` its content hash; a bundle that did not compile or an evaluation that raised is a
        deny (logged with `where`)."""
        kind = PolicyKind(row.kind) if row.kind in PolicyKind._value2member_map_ else PolicyKind.NONE
        if isinstance(bundle, Exception):
            return dataclasses.replace(Decision.bundle_error("policy_bundle_invalid", kind, row.revision),
                                       policy_hash=digest)
        try:
            decision = bundle.evaluate(inp)
        except Exception:
            log.exception("policy evaluation failed (" + where + ")", *where_args)
            return Decision(Verdict.DENY, "eval-error", "policy evaluation failed",
                            policy_kind=kind, policy_revision=row.revision, policy_hash=digest)
        # The engines know the manifest revision; the content hash is the stored revision's.
        return dataclasses.replace(decision, policy_hash=digest) if digest else decision

    def _fork_digest(self, bundle_id: int, tx: BundleReads | None) -> str:
        """A fork bundle's `policy_hash` (SHA-256 of its stored text, as a revision's), read once:
        fork bundles never change."""
        with self._lock:
            hit = self._fork_digests.get(bundle_id)
        if hit is None:
            try:
                content = self._content(bundle_id, tx, fork=True)
            except Exception:  # the resolver never raises: the decision goes without its hash
                log.exception("fork bundle %s content lookup failed", bundle_id)
                return ""
            hit = hashlib.sha256(content.encode("utf-8")).hexdigest() if content is not None else ""
            with self._lock:
                if len(self._fork_digests) >= 4096:
                    self._fork_digests.clear()
                self._fork_digests[bundle_id] = hit
        return hit

    def _content(self, revision_id: int, tx: BundleReads | None, fork: bool = False) -> str | None:
        if fork:
            if tx is not None:
                return tx.fork_bundle_content(revision_id)
            with self.store.read() as own:
                return own.fork_bundle_content(revision_id)
        if tx is not None:
            return tx.policy_content(revision_id)
        with self.store.read() as own:
            return own.policy_content(revision_id)

    def _compiled(self, row: Any, tx: BundleReads | None, fork: bool = False) -> CompiledBundle | Exception:
        # Fork bundles are cached apart from the agents' revisions (whose ids they share).
        owner = f"fork:{row.agent_id}" if fork else row.agent_id
        key = (owner, int(row.id))
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
                content = self._content(int(row.id), tx, fork)
                if content is None:
                    raise LookupError(f"policy revision {row.id} vanished")
                result = compiler(content, row.revision)
            except Exception as exc:  # a stored bundle that no longer compiles: fail closed
                log.error("stored bundle for agent %s (revision %s) does not compile: %s",
                          row.agent_id, row.revision, exc)
                result = exc
        with self._lock:
            # Keep only the newest compiled revision per agent.
            for k in [k for k in self._cache if k[0] == owner]:
                del self._cache[k]
            self._cache[key] = result
        return result
