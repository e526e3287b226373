"""Bundles pulled from an HTTP bundle server, the way OPA's bundle plugin does: each configured
agent's `.tar.gz` is polled with `If-None-Match` (the last activated ETag), between a min and max
delay; a new bundle is verified (signature, when a key is configured) and activated through the
load gate (`core.policies.store_policy`).

A download error, a bad or missing signature, or a bundle failing the load gate keeps the current
revision active: the refusal is logged with its reason, counted in /metrics and shown in
`/v0/ready`'s details. Polls run on one background thread; the kernel's answers never wait on it.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kernel.core.kernel import Kernel
from kernel.errors import RegentError, ValidationError
from kernel.policy.signature import (
    SignatureRefused,
    VerificationKey,
    policy_files,
    read_bundle_files,
    verify_bundle_files,
    yaml_bundle_file,
)

log = logging.getLogger("kernel.bundles")

MAX_DOWNLOAD_BYTES = 16 * 1024 * 1024  # a compressed bundle; it expands within the loader's limits

__all__ = ["BundlePuller", "BundlePullerCollector", "BundleSource"]


@dataclass(frozen=True)
class BundleSource:
    """One agent's bundle on a bundle server."""

    agent_id: str
    url: str
    token: str | None = field(default=None, repr=False)
    min_delay: float = 60.0
    max_delay: float = 120.0
    timeout: float = 10.0
    keys: tuple[VerificationKey, ...] = ()  # empty: signatures not required (and refused if present)
    default_key_id: str | None = None  # the key a signature naming no key id is checked with


@dataclass
class SourceStatus:
    agent_id: str
    url: str
    state: str = "waiting"  # waiting (nothing activated yet) | active
    etag: str | None = None
    active_revision: str | None = None
    policy_hash: str | None = None  # the content hash of the revision this source last activated
    activated_at: float | None = None
    last_attempt_at: float | None = None
    last_success_at: float | None = None
    last_error: dict[str, Any] | None = None
    downloads: dict[str, int] = field(default_factory=dict)  # outcome → count
    refusals: dict[str, int] = field(default_factory=dict)  # reason → count
    failures_in_a_row: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "url": self.url, "state": self.state,
                "active_revision": self.active_revision, "last_success_at": self.last_success_at,
                "last_error": self.last_error}


class BundlePuller:
    def __init__(self, k: Kernel, sources: list[BundleSource], *, rng: random.Random | None = None):
        self.k = k
        self.sources = {s.agent_id: s for s in sources}
        self.status = {s.agent_id: SourceStatus(s.agent_id, s.url) for s in sources}
        self._due = {s.agent_id: 0.0 for s in sources}
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(follow_redirects=True)
        self._lock = threading.Lock()
        self._adopt_stored()

    def _adopt_stored(self) -> None:
        """An agent that already has an active stored revision serves it until the server says
        otherwise (a restart does not wait for the bundle server)."""
        from kernel.core.policies import active_policy
        from kernel.errors import NotFound

        for st in self.status.values():
            try:
                rev = active_policy(self.k, st.agent_id)
            except NotFound:
                continue
            st.state, st.active_revision = "active", rev.revision

    # The loop ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None and self.sources:
            self._thread = threading.Thread(target=self._run, name="bundle-puller", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            due = [a for a, t in self._due.items() if t <= now]
            for agent_id in due:
                if self._stop.is_set():
                    return
                ok = self.poll(agent_id)
                self._due[agent_id] = time.monotonic() + self._delay(agent_id, ok)
            wait = max(0.0, min(self._due.values()) - time.monotonic()) if self._due else 1.0
            self._stop.wait(min(wait, 1.0))

    def _delay(self, agent_id: str, ok: bool) -> float:
        s = self.sources[agent_id]
        if ok:
            return self._rng.uniform(s.min_delay, s.max_delay)
        n = self.status[agent_id].failures_in_a_row
        base = min(s.min_delay * (2 ** max(n - 1, 0)), s.max_delay)
        return base + self._rng.uniform(0, 0.25 * base) if base < s.max_delay else s.max_delay

    # One poll ----------------------------------------------------------------------------
    def poll(self, agent_id: str) -> bool:
        """Download, verify and activate one agent's bundle if it changed; True unless refused."""
        s = self.sources[agent_id]
        st = self.status[agent_id]
        st.last_attempt_at = time.time()
        headers = {"Accept": "application/gzip, application/octet-stream"}
        if s.token:
            headers["Authorization"] = f"Bearer {s.token}"
        if st.etag and not self._still_active(st):
            # What this source served is no longer the agent's active revision (a replica not
            # configured to pull it changed it, or the store was edited): a 304 would leave that
            # standing until the server's bundle next changed, so fetch and activate it again.
            log.warning("bundle for agent %s: the active revision is no longer the one %s served; "
                        "activating it again", agent_id, s.url)
            st.etag = None
        if st.etag:
            headers["If-None-Match"] = st.etag
        try:
            raw, etag, status = self._download(s, headers)
        except Exception as exc:
            return self._refuse(st, "download_error", f"{type(exc).__name__}: {exc}")
        if status == 304:
            return self._succeeded(st, "not_modified")
        if status != 200:
            return self._refuse(st, "download_error", f"HTTP {status} from {s.url}")
        try:
            revision, policy_hash = self._activate(s, raw)
        except SignatureRefused as exc:
            return self._refuse(st, exc.reason, exc.message)
        except ValidationError as exc:
            return self._refuse(st, "load_gate", exc.message)
        except RegentError as exc:
            return self._refuse(st, "activation_error", exc.message)
        except Exception as exc:  # the kernel keeps serving whatever a bundle server sends
            log.exception("bundle for agent %s could not be activated", agent_id)
            return self._refuse(st, "activation_error", f"{type(exc).__name__}: {exc}")
        with self._lock:
            changed = st.active_revision != revision or st.state != "active"
            st.etag, st.active_revision, st.state, st.policy_hash = etag, revision, "active", policy_hash
            st.activated_at = time.time()
        if changed:
            log.info("bundle for agent %s activated: revision %s (from %s)", agent_id, revision, s.url)
        return self._succeeded(st, "activated")

    def _download(self, s: BundleSource, headers: dict[str, str]) -> tuple[bytes, str | None, int]:
        # httpx's timeout is per read: the whole body is bounded too (a server trickling it would
        # otherwise hold the one puller thread, and every agent's updates, indefinitely).
        deadline = time.monotonic() + 2 * s.timeout
        with self._client.stream("GET", s.url, headers=headers, timeout=s.timeout) as r:
            if r.status_code != 200:
                return b"", None, r.status_code
            chunks, size = [], 0
            for chunk in r.iter_bytes():
                size += len(chunk)
                if size > MAX_DOWNLOAD_BYTES:
                    raise ValueError(f"bundle download is larger than {MAX_DOWNLOAD_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"bundle download took over {2 * s.timeout:g}s")
                chunks.append(chunk)
            return b"".join(chunks), r.headers.get("ETag"), 200

    def _still_active(self, st: SourceStatus) -> bool:
        from kernel.core.policies import active_policy
        from kernel.errors import NotFound

        try:
            return active_policy(self.k, st.agent_id).content_hash == st.policy_hash
        except NotFound:
            return False
        except Exception:  # the store did not answer: keep polling as before (activating would fail too)
            log.warning("bundle for agent %s: the active revision could not be read", st.agent_id, exc_info=True)
            return True

    def _activate(self, s: BundleSource, raw: bytes) -> tuple[str, str]:
        from kernel.core.policies import puller, store_policy

        kind, content = bundle_content(s, raw)
        # The load gate; activates, credited to the source in the policy audit trail.
        rev = store_policy(self.k, s.agent_id, kind, content, puller(s.url))
        assert rev is not None  # bundle_content never yields the empty YAML text that clears
        return rev.revision, rev.content_hash

    def _succeeded(self, st: SourceStatus, outcome: str) -> bool:
        with self._lock:
            st.downloads[outcome] = st.downloads.get(outcome, 0) + 1
            st.last_success_at = time.time()
            st.failures_in_a_row = 0
            st.last_error = None
        return True

    def _refuse(self, st: SourceStatus, reason: str, message: str) -> bool:
        with self._lock:
            st.downloads["refused"] = st.downloads.get("refused", 0) + 1
            st.refusals[reason] = st.refusals.get(reason, 0) + 1
            st.failures_in_a_row += 1
            st.last_error = {"reason": reason, "message": message, "at": time.time()}
            kept = st.active_revision
        log.warning("bundle for agent %s refused (%s): %s; keeping revision %s", st.agent_id, reason,
                    message, kept or "(none)")
        return False

    # What /v0/ready and /metrics show ----------------------------------------------------
    def ready(self) -> tuple[bool, dict[str, Any]]:
        """Ready once every pulled agent has a bundle active (stored or downloaded)."""
        with self._lock:
            details = {a: st.to_json() for a, st in self.status.items()}
        return all(d["state"] == "active" for d in details.values()), details


def bundle_content(s: BundleSource, raw: bytes) -> tuple[str, str]:
    """(kind, stored content) of a downloaded bundle, its signature checked first.

    A gzip (or plain tar) body is a tarball in OPA's layout: a Rego bundle, or a YAML bundle when it holds no
    `.rego` module and exactly one YAML file other than `data.yaml` (beside an optional
    `.manifest` and `.signatures.json`), so a YAML bundle can be signed as a Rego one is. Any
    other body is a plain YAML bundle file, which cannot carry a signature: with a verification
    key configured it is refused `signature_missing`. An empty bundle is refused (stored, empty
    YAML text would clear the agent's policy).
    """
    from kernel.policy.rego import parse_rego_tarball

    keys = list(s.keys) or None
    # A plain tar is a tarball too: a server sending the .tar.gz with `Content-Encoding: gzip` has it
    # decoded on the way in. Anything else that is not gzip is a YAML bundle file.
    if raw[:2] != b"\x1f\x8b" and raw[257:262] != b"ustar":
        if keys:
            raise SignatureRefused("signature_missing", "the body is a plain YAML bundle, which cannot carry a "
                                   "signature, and a verification key is configured (serve it in a signed .tar.gz)")
        return "yaml", _yaml_text(raw, s.url)
    files = read_bundle_files(raw)
    verify_bundle_files(files, keys, default_key_id=s.default_key_id)  # raises SignatureRefused
    yaml_file = yaml_bundle_file(files)
    if yaml_file is not None:
        return "yaml", _yaml_text(files[yaml_file], f"{s.url}: {yaml_file}")
    policy = policy_files(files)
    if not any(name.endswith(".rego") for name in policy):
        raise ValidationError(f"{s.url}: the tarball holds no .rego module and not exactly one YAML bundle file "
                              f"(found: {', '.join(sorted(policy)) or 'nothing'})")
    bundle = parse_rego_tarball(raw, origin=s.url)
    mapping = {"modules": dict(bundle.modules), "data": bundle.data, "manifest": bundle.manifest}
    return "rego", json.dumps(mapping, sort_keys=True, ensure_ascii=False)


def _yaml_text(raw: bytes, where: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{where}: a YAML bundle must be UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise ValidationError(f"{where}: the bundle is empty")
    return text


class BundlePullerCollector(Collector):
    def __init__(self, puller: BundlePuller):
        self.puller = puller

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        downloads = CounterMetricFamily("regent_bundle_downloads", "Bundle server polls, by agent and "
                                        "outcome (activated, not_modified, refused).", labels=["agent", "outcome"])
        refusals = CounterMetricFamily("regent_bundle_refusals", "Bundles refused (the active revision "
                                       "kept), by agent and reason.", labels=["agent", "reason"])
        active = GaugeMetricFamily("regent_bundle_active", "1 when the agent has an activated bundle.",
                                   labels=["agent"])
        last_ok = GaugeMetricFamily("regent_bundle_last_success_timestamp_seconds", "When the last poll "
                                    "succeeded (activated or not modified).", labels=["agent"])
        with self.puller._lock:
            for a, st in sorted(self.puller.status.items()):
                for outcome, n in sorted(st.downloads.items()):
                    downloads.add_metric([a, outcome], n)
                for reason, n in sorted(st.refusals.items()):
                    refusals.add_metric([a, reason], n)
                active.add_metric([a], 1.0 if st.state == "active" else 0.0)
                if st.last_success_at is not None:
                    last_ok.add_metric([a], st.last_success_at)
        yield downloads
        yield refusals
        yield active
        yield last_ok


def bundle_sources(settings: Any, manifest: Any | None) -> list[BundleSource]:
    """Every agent whose bundle is pulled: `bundle:` in the provisioning manifest, and
    REGENT_BUNDLE_AGENTS (each at `bundles/<agent_id>.tar.gz` under REGENT_BUNDLE_SERVER_URL).
    Fields the manifest leaves unset take the REGENT_BUNDLE_* settings."""
    from kernel.errors import ConfigError
    from kernel.manifest import ManifestBundle

    wanted: dict[str, ManifestBundle] = {}
    for a in (manifest.agents if manifest is not None else ()):
        if a.bundle is not None:
            wanted[a.id] = a.bundle
    for agent_id in (settings.bundle_agents or "").split(","):
        if agent_id.strip():
            wanted.setdefault(agent_id.strip(), ManifestBundle())
    token = settings.bundle_server_token.get_secret_value() if settings.bundle_server_token else None
    shared_keys = _shared_keys(settings)
    out = []
    for agent_id, b in wanted.items():
        url = b.url
        if url is None:
            if not settings.bundle_server_url:
                raise ConfigError(f"agent {agent_id!r} pulls its bundle but REGENT_BUNDLE_SERVER_URL is not set "
                                  "(or give the manifest's bundle a full `url`)")
            resource = (b.resource or f"bundles/{agent_id}.tar.gz").lstrip("/")
            url = settings.bundle_server_url.rstrip("/") + "/" + resource
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"agent {agent_id!r}: bundle URL {url!r} must be http:// or https://")
        min_delay = b.min_delay_seconds if b.min_delay_seconds is not None else settings.bundle_min_delay
        max_delay = b.max_delay_seconds if b.max_delay_seconds is not None else settings.bundle_max_delay
        if max_delay < min_delay:
            raise ConfigError(f"agent {agent_id!r}: bundle max delay {max_delay:g}s is below the min delay "
                              f"{min_delay:g}s")
        keys = _verification_keys(agent_id, b, settings, shared_keys)
        out.append(BundleSource(agent_id, url, token=token, min_delay=min_delay, max_delay=max_delay,
                                timeout=settings.bundle_timeout, keys=keys,
                                default_key_id=b.key_id or settings.bundle_verification_key_id))
    return out


def _shared_keys(settings: Any) -> list[tuple[str, str, str | None, str | None]]:
    """REGENT_BUNDLE_VERIFICATION_KEYS: OPA's `keys` config as JSON, key id → {key, algorithm, scope}."""
    from kernel.errors import ConfigError

    text = settings.bundle_verification_keys
    if not text:
        return []
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"REGENT_BUNDLE_VERIFICATION_KEYS is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not doc:
        raise ConfigError('REGENT_BUNDLE_VERIFICATION_KEYS must be a JSON object {"<key id>": {"key": …, '
                          '"algorithm": …, "scope": …}}')
    out = []
    for key_id, entry in doc.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str) or not entry["key"] \
                or set(entry) - {"key", "algorithm", "scope"} \
                or any(not isinstance(entry.get(f), (str, type(None))) for f in ("algorithm", "scope")):
            raise ConfigError(f"REGENT_BUNDLE_VERIFICATION_KEYS: key {key_id!r} must be "
                              '{"key": "<PEM file or text, or HMAC secret>", "algorithm": …, "scope": …}')
        out.append((key_id, entry["key"], entry.get("algorithm"), entry.get("scope")))
    return out


def _verification_keys(agent_id: str, b: Any, settings: Any,
                       shared: list[tuple[str, str, str | None, str | None]]) -> tuple[VerificationKey, ...]:
    """An agent's verification keys: the shared REGENT_BUNDLE_VERIFICATION_KEYS, the manifest's
    `bundle.keys` (which win on the same key id), and the single `verification_key` under
    `key_id`. The bundle's `scope` (or REGENT_BUNDLE_VERIFICATION_SCOPE) wins over a key's own."""
    from kernel.errors import ConfigError
    from kernel.policy.signature import read_key

    entries: dict[str | None, tuple[str, str | None, str | None]] = {}
    for key_id, key, algorithm, scope in [*shared, *b.keys]:
        entries[key_id] = (key, algorithm, scope)
    single = b.verification_key or settings.bundle_verification_key
    if single:
        entries[b.key_id or settings.bundle_verification_key_id] = (single, b.algorithm, None)
    out = []
    for key_id, (key, algorithm, scope) in entries.items():
        try:
            out.append(VerificationKey(read_key(key), algorithm or settings.bundle_verification_algorithm, key_id,
                                       b.scope or settings.bundle_verification_scope or scope))
        except (ValidationError, OSError) as exc:
            raise ConfigError(f"agent {agent_id!r}: bundle verification key {key_id or ''}: {exc}") from None
    return tuple(out)
