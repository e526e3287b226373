"""RegoEngine: evaluates Rego bundles for steps in isolated worker processes; never raises a deny.

A fault or timeout during evaluation denies with rule id `eval-error`; a bundle the worker cannot
compile (error, crash or load timeout) denies with `bundle-error` and is remembered, so a broken
revision does not cost a worker per step. Each fault is logged with the revision and counted.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel.domain.decision import Decision, PolicyInput, PolicyKind, Verdict
from kernel.policy.numbers import out_of_range_reason, unrepresentable_number

from . import protocol as P
from .bundle import RegoBundle
from .decision import decision_from_output, eval_error
from .diagnostics import CompileError, compile_errors
from .document import input_document
from .pool import DEFAULT_MAX_RSS_BYTES, DEFAULT_SPIN_SECONDS, WorkerFault, WorkerHandle, WorkerPool
from .trace import ProbeError, locate_error

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "CompileReport", "ProbeError", "RegoEngine"]

log = logging.getLogger("kernel.policy.rego")

DEFAULT_TIMEOUT_SECONDS = 0.25
_WORKER_BUNDLE_CACHE = 64  # worker.Worker.max_bundles
_BROKEN_MEMORY = 256
_MISSING_TWICE = "it answered 'bundle missing' twice, the second time right after loading the bundle"
_BATCH = 256  # input documents per OP_EVAL_BATCH
_BATCH_SECONDS_PER_INPUT = 0.01  # on top of the timeout, for a whole batch
_OUTCOME_COUNTER = {
    Verdict.ALLOW: "allowed",
    Verdict.DENY: "denied",
    Verdict.REQUIRE_APPROVAL: "require_approval",
}
_COUNTERS = (
    "evaluations",
    "allowed",
    "denied",
    "require_approval",
    "eval_errors",
    "bundle_errors",
    "timeouts",
    "crashes",
    "bundle_loads",
)


@dataclass(frozen=True)
class CompileReport:
    """How a worker took a bundle: compiled, or why not."""

    ok: bool
    errors: tuple[CompileError, ...] = ()
    crash: str = ""  # set when the worker died or hung compiling it
    builtins: dict[str, bool] = field(default_factory=dict)  # called name → rego-cpp has it


@dataclass(slots=True)
class _Call:
    """What `RegoEngine._call` came to: no worker, a bundle that did not compile (``report``), a
    fault in ``phase`` ("compiling" or "evaluating"), or the worker's reply."""

    worker: WorkerHandle | None
    phase: str = "compiling"
    report: CompileReport | None = None
    fault: WorkerFault | None = None
    op: int = 0
    reply: bytes = b""


class RegoEngine:
    """Thread-safe; `evaluate` may be called from many request threads at once."""

    def __init__(
        self,
        size: int = 2,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        load_timeout: float = 10.0,
        acquire_timeout: float = 5.0,
        start_timeout: float = 10.0,
        max_rss_bytes: int = DEFAULT_MAX_RSS_BYTES,
        test_hooks: bool = False,
        nice: int = 0,
        spin_seconds: float = DEFAULT_SPIN_SECONDS,
    ):
        self.timeout = timeout
        self.load_timeout = load_timeout
        self.acquire_timeout = acquire_timeout
        self._pool = WorkerPool(
            size,
            start_timeout=start_timeout,
            max_rss_bytes=max_rss_bytes,
            test_hooks=test_hooks,
            nice=nice,
            spin_seconds=spin_seconds,
        )
        self._lock = threading.Lock()
        self._broken: OrderedDict[str, str] = OrderedDict()  # digest → bundle-error reason
        self._load_faults: dict[str, int] = {}  # digest → crashes/timeouts while compiling it
        # Plain attributes (and stats()), for a metrics exporter to read.
        self.evaluations = 0
        self.allowed = 0
        self.denied = 0
        self.require_approval = 0
        self.eval_errors = 0
        self.bundle_errors = 0
        self.timeouts = 0
        self.crashes = 0
        self.bundle_loads = 0
        for quirk in self.capabilities.get("quirks", []):
            log.info("rego-cpp %s: %s", self.capabilities.get("regopy", "?"), quirk)

    # -- public ------------------------------------------------------------------------------
    @property
    def capabilities(self) -> dict[str, Any]:
        """The workers' start-up probe: build info, `unavailable` builtins, known `quirks`."""
        return self._pool.hello

    def evaluate(self, bundle: RegoBundle, inp: PolicyInput) -> Decision:
        return self.evaluate_document(bundle, input_document(inp))

    def evaluate_document(self, bundle: RegoBundle, document: dict[str, Any]) -> Decision:
        decision = self._evaluate(bundle, document)
        with self._lock:
            self.evaluations += 1
            outcome = _OUTCOME_COUNTER[decision.verdict]
            setattr(self, outcome, getattr(self, outcome) + 1)
        return decision

    def evaluate_many(self, bundle: RegoBundle, inputs: list[PolicyInput]) -> list[Decision]:
        """What `evaluate` answers for each input, in worker calls of up to 256 inputs (the policy
        test runner's cases). A batch that faults (a crash, a timeout) or cannot be sent is
        evaluated again one input at a time, so only the input at fault gets its eval-error."""
        documents = [input_document(i) for i in inputs]
        out: list[Decision] = []
        for start in range(0, len(documents), _BATCH):
            chunk = documents[start : start + _BATCH]
            got = self._evaluate_batch(bundle, chunk)
            out += got if got is not None else [self._evaluate(bundle, d) for d in chunk]
        with self._lock:
            self.evaluations += len(out)
            for decision in out:
                outcome = _OUTCOME_COUNTER[decision.verdict]
                setattr(self, outcome, getattr(self, outcome) + 1)
        return out

    def explain(self, bundle: RegoBundle, inp: PolicyInput) -> tuple[Decision, str]:
        """The decision and what the policy's `print()` calls wrote while making it."""
        prints: list[str] = []
        decision = self._evaluate(bundle, input_document(inp), prints)
        return decision, "".join(prints)

    def probe(self, bundle: RegoBundle, document: dict[str, Any], entrypoints: list[str]) -> list[dict[str, Any]]:
        """Evaluate several entrypoints of ``bundle`` on one input in one worker call (traces,
        coverage and error locations use the instrumented twin this way). Each result is
        ``{"value": V}``, ``{"undefined": True}`` or ``{"error": MESSAGE}``; raises ProbeError
        when the bundle cannot be loaded or the worker faults."""
        bad = unrepresentable_number(document)
        if bad is not None:
            raise ProbeError(out_of_range_reason(bad))
        body = json.dumps({"input": document, "entrypoints": entrypoints}, ensure_ascii=False,
                          separators=(",", ":"), allow_nan=False).encode("utf-8")
        call = self._call(bundle, P.OP_PROBE, body, max(self.timeout, 0.05) * (1 + len(entrypoints) / 8))
        if call.worker is None:
            raise ProbeError("no rego worker became available")
        if call.report is not None:
            raise ProbeError("; ".join(str(e) for e in call.report.errors[:3]) or "rego-cpp could not build it")
        if call.fault is not None:
            raise ProbeError(self._fault(call.worker, call.fault, bundle, call.phase)) from None
        if call.op != P.OP_OK:
            raise ProbeError(_error_of(call.reply))
        results: list[dict[str, Any]] = []
        for r in json.loads(call.reply)["results"]:
            if "value" in r:
                try:
                    results.append({"value": json.loads(r["value"])["expressions"][0]})
                except (ValueError, KeyError, IndexError, TypeError):
                    results.append({"error": "rego-cpp returned an unreadable value"})
            else:
                results.append(r)
        return results

    def compile(self, bundle: RegoBundle) -> CompileReport:
        """Compile `bundle` in a worker (the load gate's compile step), which keeps the
        compiled copy; never raises."""
        w = self._pool.acquire(self.acquire_timeout)
        if w is None:
            return CompileReport(False, crash="no rego worker became available")
        try:
            report = self._load_on(w, bundle)
        except WorkerFault as fault:
            return CompileReport(False, crash=self._fault(w, fault, bundle, "compiling"))
        self._pool.release(w)
        return report

    def stats(self) -> dict[str, Any]:
        with self._lock:
            counts = {name: getattr(self, name) for name in _COUNTERS}
        return {
            **counts,
            "workers": self._pool.live_count(),
            "workers_started": self._pool.workers_started,
            "workers_replaced": self._pool.workers_replaced,
            "worker_start_failures": self._pool.start_failures,
            "broken_bundles": len(self._broken),
        }

    def worker_pids(self) -> list[int]:
        return self._pool.pids()

    def wait_ready(self, timeout: float = 10.0) -> bool:
        return self._pool.wait_ready(timeout)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> RegoEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def _evaluate(self, bundle: RegoBundle, document: dict[str, Any], prints: list[str] | None = None) -> Decision:
        broken = self._broken.get(bundle.digest)
        if broken is not None:
            return self._bundle_error(bundle, broken)
        if self._pool.closed:
            return self._eval_error(bundle, "rego engine is closed", logged=True)
        try:
            body = json.dumps(
                document, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            ).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError) as exc:
            bad = unrepresentable_number(document)  # NaN or an infinity: ValueError
            if bad is not None:
                return self._eval_error(bundle, out_of_range_reason(bad))
            return self._eval_error(bundle, f"input document is not JSON-encodable: {exc}")
        # A float rego-cpp cannot compute with is written with an exponent of e-3xx or e+308, so
        # the 1 µs search spares almost every document the walk.
        if (b"e-3" in body or b"e+308" in body) and (bad := unrepresentable_number(document)) is not None:
            # the answer a YAML bundle gives the same input (kernel/policy/numbers.py)
            return self._eval_error(bundle, out_of_range_reason(bad))
        then = None
        if prints is not None:
            def then(w: WorkerHandle) -> None:
                _, printed = w.call(P.OP_LAST_PRINTS, b"", self.timeout)
                prints.append(printed.decode("utf-8", "replace"))
        call = self._call(bundle, P.OP_EVAL if prints is None else P.OP_EVAL_PRINTS, body, self.timeout, then)
        w = call.worker
        if w is None:
            if self._pool.closed:
                return self._eval_error(bundle, "rego engine is closed", logged=True)
            return self._eval_error(bundle, f"no rego worker became available within {self.acquire_timeout:g}s")
        if call.report is not None:
            reason = "; ".join(str(e) for e in call.report.errors[:3])
            return self._remember_broken(bundle, reason or "rego-cpp could not build it")
        if call.fault is not None:
            reason = self._fault(w, call.fault, bundle, call.phase)
            if call.phase == "compiling":
                reason = f"the rego worker {reason} while compiling it"
                # Once may be the machine (the OOM killer, say); twice is the bundle.
                with self._lock:
                    if len(self._load_faults) > _BROKEN_MEMORY:
                        self._load_faults.clear()
                    faults = self._load_faults[bundle.digest] = self._load_faults.get(bundle.digest, 0) + 1
                if faults >= 2:
                    return self._remember_broken(bundle, reason)
                return self._bundle_error(bundle, reason)
            return self._eval_error(bundle, reason, logged=True)
        w.loaded.move_to_end(bundle.digest)
        op, reply = call.op, call.reply
        if op == P.OP_UNDEFINED:
            return self._decision(bundle, document, "undefined", "")
        if op == P.OP_VALUE:
            return self._decision(bundle, document, "value", reply)
        if op == P.OP_FAIL:
            return self._decision(bundle, document, "error", _error_of(reply))
        return self._eval_error(bundle, f"unexpected reply {op} from the rego worker")

    def probe_many(self, bundle: RegoBundle, documents: list[dict[str, Any]], entrypoint: str) -> list[dict[str, Any]] | None:
        """One entrypoint of ``bundle`` on each document, in batched worker calls (coverage of a
        case run); each result as `probe` gives it, or None when the caller should probe them
        one by one instead (a fault, no worker, the bundle not loaded)."""
        out: list[dict[str, Any]] = []
        for start in range(0, len(documents), _BATCH):
            raw = self._batch_call(bundle, documents[start : start + _BATCH], entrypoint)
            if raw is None:
                return None
            for r in raw:
                if "value" in r:
                    try:
                        out.append({"value": json.loads(r["value"])["expressions"][0]})
                    except (ValueError, KeyError, IndexError, TypeError):
                        out.append({"error": "rego-cpp returned an unreadable value"})
                else:
                    out.append(r)
        return out

    def _evaluate_batch(self, bundle: RegoBundle, documents: list[dict[str, Any]]) -> list[Decision] | None:
        """One OP_EVAL_BATCH call for ``documents``; None when the caller should evaluate them one
        by one instead (no worker, the bundle not loaded, a fault, a reply that does not fit)."""
        broken = self._broken.get(bundle.digest)
        if broken is not None:
            return [self._bundle_error(bundle, broken) for _ in documents]
        results = self._batch_call(bundle, documents)
        if results is None:
            return None
        out = []
        for document, r in zip(documents, results, strict=True):
            if "value" in r:
                out.append(self._decision(bundle, document, "value", str(r["value"]).encode("utf-8")))
            elif r.get("undefined"):
                out.append(self._decision(bundle, document, "undefined", ""))
            else:
                out.append(self._decision(bundle, document, "error", str(r.get("error", "unknown error"))))
        return out

    def _batch_call(self, bundle: RegoBundle, documents: list[dict[str, Any]],
                    entrypoint: str | None = None) -> list[dict[str, Any]] | None:
        """The worker's raw OP_EVAL_BATCH results (dicts, "value" as rego-cpp's text), or None."""
        if self._pool.closed or self._broken.get(bundle.digest) is not None:
            return None
        request: dict[str, Any] = {"inputs": documents}
        if entrypoint:
            request["entrypoint"] = entrypoint
        try:
            body = json.dumps(request, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError):
            return None
        if (b"e-3" in body or b"e+308" in body) and any(unrepresentable_number(d) is not None for d in documents):
            return None  # one by one: each such input gets the out-of-range answer (see _evaluate)
        call = self._call(bundle, P.OP_EVAL_BATCH, body, self.timeout + _BATCH_SECONDS_PER_INPUT * len(documents))
        w = call.worker
        if w is None or call.report is not None:
            return None  # one by one: the first input remembers why the bundle is broken
        if call.fault is not None:
            how, _ = self._pool.discard(w, call.fault)  # counted when the input at fault faults again
            log.info("rego worker %d %s on a batch of %d inputs of bundle revision %s: evaluating them one by one",
                     w.pid, how, len(documents), bundle.revision)
            return None
        w.loaded.move_to_end(bundle.digest)
        try:
            results = json.loads(call.reply)["results"] if call.op == P.OP_OK else None
        except (ValueError, KeyError, TypeError):
            results = None
        if not isinstance(results, list) or len(results) != len(documents):
            return None
        return [r if isinstance(r, dict) else {"error": "the rego worker returned an unreadable batch result"}
                for r in results]

    def _decision(self, bundle: RegoBundle, document: dict[str, Any], outcome: str, text: str | bytes) -> Decision:
        """The Decision for what the worker answered: "value" (rego-cpp's rendering of the
        entrypoint's output), "undefined", or "error" (its message)."""
        revision = bundle.revision
        kind = document.get("kind", "") if isinstance(document, dict) else ""
        value: Any = None
        defined = outcome == "value"
        if outcome == "value":
            try:
                value = json.loads(text)["expressions"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                return self._eval_error(bundle, "rego-cpp returned an unreadable value")
        elif outcome == "error":
            message = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
            where = self._locate(bundle, document, message)
            return self._eval_error(bundle, f"rego evaluation failed: {message}{where}")
        decision = decision_from_output(value, defined=defined, kind=kind, default_action=bundle.default_action,
                                        revision=revision, entrypoint=bundle.entrypoint)
        if decision.rule_id == "eval-error":
            self._count("eval_errors")
            log.warning("rego bundle %s returned a bad decision: %s", revision, decision.reason)
        return decision

    def _locate(self, bundle: RegoBundle, document: dict[str, Any], message: str) -> str:
        """` at FILE:LINE (rule …)` for an evaluation error, from the instrumented twin's probes;
        "" when they cannot tell (only the error path pays for this)."""
        if message.startswith("input document"):
            return ""
        try:
            where = locate_error(self, bundle, document, message)
        except Exception:  # the locator must never turn a deny into a crash
            log.exception("rego bundle revision %s: could not locate an evaluation error", bundle.revision)
            return ""
        return f" at {where}" if where else ""

    def _call(self, bundle: RegoBundle, op: int, body: bytes, timeout: float,
              then: Callable[[WorkerHandle], None] | None = None) -> _Call:
        """Take a worker, compile ``bundle`` on it unless it holds it, send ``op`` with the
        bundle's digest and ``body``, and do both once more if the worker evicted the bundle in
        between (OP_MISSING); ``then`` runs on the worker before it goes back. The worker goes
        back to the pool unless it faulted: a fault is the caller's to discard and count. A worker
        that answers OP_MISSING again right after the reload it asked for has faulted (a
        "protocol" fault): its cache no longer tracks what it loads, so it is not trusted again."""
        w = self._pool.acquire(self.acquire_timeout)
        call = _Call(w)
        if w is None:
            return call
        try:
            for _attempt in range(2):
                if bundle.digest not in w.loaded:
                    call.phase = "compiling"
                    report = self._load_on(w, bundle)
                    if not report.ok:
                        self._pool.release(w)
                        call.report = report
                        return call
                call.phase = "evaluating"
                call.op, call.reply = w.call(op, bundle.digest.encode("ascii") + body, timeout)
                if call.op != P.OP_MISSING:
                    break
                w.loaded.pop(bundle.digest, None)  # the worker evicted it: load and try again
            else:
                raise WorkerFault("protocol", _MISSING_TWICE)
            if then is not None:
                then(w)
        except WorkerFault as fault:
            call.fault = fault
            return call
        self._pool.release(w)
        return call

    def _load_on(self, w: WorkerHandle, bundle: RegoBundle) -> CompileReport:
        op, reply = w.call(P.OP_LOAD, bundle.worker_payload, self.load_timeout)
        self._count("bundle_loads")
        try:
            body = json.loads(reply) if reply else {}
        except ValueError:
            body = {}
        builtins = body.get("builtins") or {}
        if op == P.OP_OK:
            w.loaded[bundle.digest] = None
            while len(w.loaded) > _WORKER_BUNDLE_CACHE:
                w.loaded.popitem(last=False)
            return CompileReport(True, builtins=builtins)
        errors = compile_errors(body.get("error", ""), body.get("report", ""), bundle.modules)
        return CompileReport(False, errors=tuple(errors), builtins=builtins)

    def _fault(self, w: WorkerHandle, fault: WorkerFault, bundle: RegoBundle, phase: str) -> str:
        """Discard the worker, count and log the fault; returns a reason for the decision."""
        how, tail = self._pool.discard(w, fault)
        if fault.kind == "timeout":
            self._count("timeouts")
            limit = self.timeout if phase == "evaluating" else self.load_timeout
            reason = f"rego evaluation timed out after {limit * 1000:g} ms (worker killed)"
            if phase != "evaluating":
                reason = f"timed out after {limit:g}s"
        elif fault.kind == "protocol":  # counted with the crashes (regent_rego_faults kind=crash)
            self._count("crashes")  # raised only once evaluating (_call's second OP_MISSING)
            reason = f"rego worker broke the protocol {phase} and was {how}"
        else:
            self._count("crashes")
            reason = f"rego worker crashed {phase} ({how})"
            if phase != "evaluating":
                reason = f"crashed ({how})"
        log.warning(
            "rego worker %d %s while %s bundle revision %s (digest %s)%s",
            w.pid,
            "timed out" if fault.kind == "timeout" else how,
            phase,
            bundle.revision,
            bundle.digest[:12],
            f": {tail}" if tail else "",
        )
        return reason

    def _remember_broken(self, bundle: RegoBundle, reason: str) -> Decision:
        with self._lock:
            self._broken[bundle.digest] = reason
            self._load_faults.pop(bundle.digest, None)
            while len(self._broken) > _BROKEN_MEMORY:
                self._broken.popitem(last=False)
        log.warning("rego bundle revision %s cannot be loaded: %s", bundle.revision, reason)
        return self._bundle_error(bundle, reason)

    def _bundle_error(self, bundle: RegoBundle, reason: str) -> Decision:
        self._count("bundle_errors")
        return Decision.bundle_error(f"policy_bundle_invalid: {reason}", PolicyKind.REGO, bundle.revision)

    def _eval_error(self, bundle: RegoBundle, reason: str, *, logged: bool = False) -> Decision:
        self._count("eval_errors")
        if not logged:
            log.warning("rego bundle revision %s: %s", bundle.revision, reason)
        return eval_error(reason, bundle.revision)


def _error_of(reply: bytes) -> str:
    try:
        return str(json.loads(reply).get("error", "unknown error"))
    except (ValueError, AttributeError):
        return "unknown error"
