"""Bundle signatures in OPA's format: `.signatures.json` holds one JWT (RS256, ES256 or HS256 and
their 384/512 siblings) whose `files` claim lists every file of the bundle with its SHA-256.

Hashes follow OPA's `bundle/hash.go`: a structured file (`.manifest`, `data.json`, `data.yaml`) is
parsed and hashed in a canonical encoding (object keys sorted, no whitespace, number lexemes
kept, strings escaped as Go does without HTML escaping); any other file is hashed as its bytes.
So `opa sign` output verifies here and `regent policy sign` output verifies in OPA.

Verification (OPA's `bundle/verify.go`): exactly one JWT; its key id (header `kid`, else the
`keyid` claim, else the configured default) must name a configured key; the JWT must verify with
that key and its algorithm; `scope` must equal the configured scope; `exp`/`nbf`, when present,
must hold (OPA ignores them; Regent refuses an expired signature). Every file of the bundle but
`.signatures.json` must be listed with a matching digest (compared in constant time), and every
listed file must be present.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import posixpath
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kernel import yamldoc
from kernel.errors import ValidationError
from kernel.policy.rego.bundle import MAX_BUNDLE_BYTES, MAX_BUNDLE_FILES
from kernel.policy.rego.bundle_files import strip_top_directory

__all__ = [
    "ALGORITHMS",
    "SIGNATURES_FILE",
    "SignatureRefused",
    "VerificationKey",
    "bundle_file_hashes",
    "file_hash",
    "hashed_bytes",
    "read_bundle_files",
    "read_key",
    "sign_bundle_files",
    "verify_bundle_files",
    "verify_token",
]

SIGNATURES_FILE = ".signatures.json"
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
              "HS256", "HS384", "HS512")
_STRUCTURED = (".manifest", "data.json", "data.yaml", "signatures.json")
_HASHES = {"SHA-256": hashlib.sha256, "SHA-384": hashlib.sha384, "SHA-512": hashlib.sha512,
           "SHA-224": hashlib.sha224}
_MAX_TAR_BYTES = 2 * MAX_BUNDLE_BYTES + 1024 * MAX_BUNDLE_FILES


class SignatureRefused(ValidationError):
    """A bundle whose signature does not verify. `reason` is a stable word for metrics:
    signature_missing, signature_unexpected, signature_malformed, signature_invalid,
    signature_expired, key_unknown, scope_mismatch, file_unsigned, file_missing, digest_mismatch."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"bundle signature refused ({reason}): {message}", details={"reason": reason})
        self.reason = reason


@dataclass(frozen=True)
class VerificationKey:
    """One configured key: PEM public key (RS/PS/ES) or shared secret (HS); `key_id` is the name
    a signature may give (`kid`); `scope` the scope every signature must carry (None: none)."""

    key: str = field(repr=False)
    algorithm: str = "RS256"
    key_id: str | None = None
    scope: str | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValidationError(f"unsupported signature algorithm {self.algorithm!r} "
                                  f"(one of {', '.join(ALGORITHMS)})")


def read_key(value: str) -> str:
    """A key given as a path to a file (PEM) or as the key text itself (PEM or an HMAC secret)."""
    if "\n" not in value and len(value) < 4096 and os.path.isfile(value):
        return Path(value).read_text(encoding="utf-8")
    return value


# -- hashing ---------------------------------------------------------------------------------


class _Number(str):
    """A JSON number kept as its lexeme (OPA decodes with UseNumber)."""


def _go_string(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif o < 0x20 or ch in ("\u2028", "\u2029"):
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _walk(v: Any, parts: list[str]) -> None:
    if isinstance(v, dict):
        parts.append("{")
        for i, key in enumerate(sorted(v)):
            if i:
                parts.append(",")
            parts.append(_go_string(key))
            parts.append(":")
            _walk(v[key], parts)
        parts.append("}")
    elif isinstance(v, list):
        parts.append("[")
        for i, item in enumerate(v):
            if i:
                parts.append(",")
            _walk(item, parts)
        parts.append("]")
    elif isinstance(v, _Number):
        parts.append(str.__str__(v))
    elif v is True:
        parts.append("true")
    elif v is False:
        parts.append("false")
    elif v is None:
        parts.append("null")
    elif isinstance(v, str):
        parts.append(_go_string(v))
    elif isinstance(v, int | float):  # from YAML
        parts.append(json.dumps(v))
    else:
        parts.append(_go_string(str(v)))


def _structured(name: str) -> bool:
    return posixpath.basename(name) in _STRUCTURED


def _parse_structured(name: str, data: bytes) -> Any:
    text = data.decode("utf-8")
    if posixpath.basename(name) == "data.yaml":
        return yamldoc.safe_load(text)  # aliases bounded: this runs before the signature is checked

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_int=_Number, parse_float=_Number, parse_constant=refuse)


def hashed_bytes(name: str, data: bytes) -> bytes:
    """What OPA feeds the hash for a bundle file: its bytes, or a structured file's canonical
    encoding."""
    if not _structured(name):
        return data
    parts: list[str] = []
    try:
        _walk(_parse_structured(name, data), parts)
    except (ValueError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:  # Recursion: nested too deep
        raise ValidationError(f"{name}: cannot be parsed for hashing ({exc})") from None
    return "".join(parts).encode("utf-8")


def file_hash(name: str, data: bytes, algorithm: str = "SHA-256") -> str:
    """The hex digest OPA records for a bundle file. Only the SHA-2 family is accepted (OPA also
    takes MD5 and SHA-1; Regent refuses a signature built on them)."""
    factory = _HASHES.get(algorithm)
    if factory is None:
        raise ValidationError(f"{name}: unsupported hashing algorithm {algorithm!r} (SHA-224/256/384/512)")
    return factory(hashed_bytes(name, data)).hexdigest()


def bundle_file_hashes(files: dict[str, bytes]) -> list[dict[str, str]]:
    return [{"name": name, "hash": file_hash(name, data), "algorithm": "SHA-256"}
            for name, data in sorted(files.items()) if name != SIGNATURES_FILE]


# -- reading the files of a bundle -----------------------------------------------------------


def _normal(name: str) -> str | None:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or "\x00" in name or "\\" in name:
        return None
    return "/".join(parts)


def read_bundle_files(source: str | os.PathLike[str] | bytes) -> dict[str, bytes]:
    """Every regular file of a bundle (directory, tarball path or tarball bytes), by its path
    from the bundle root — the names a signature lists."""
    if isinstance(source, bytes):
        return _tar_files(source, "tarball")
    p = Path(source)
    if p.is_dir():
        files: dict[str, bytes] = {}
        total = 0
        for dirpath, dirnames, filenames in os.walk(p, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                full = Path(dirpath) / name
                if full.is_symlink() or not full.is_file():
                    continue
                rel = full.relative_to(p).as_posix()
                total += full.stat().st_size
                if total > MAX_BUNDLE_BYTES or len(files) >= MAX_BUNDLE_FILES:
                    raise ValidationError(f"{p}: bundle is too large to sign or verify")
                files[rel] = full.read_bytes()
        return files
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ValidationError(f"{p}: cannot read ({exc.strerror or exc})") from None
    return _tar_files(raw, str(p))


def _tar_files(raw: bytes, name: str) -> dict[str, bytes]:
    import gzip

    try:
        if raw[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
                raw = gz.read(_MAX_TAR_BYTES + 1)
        if len(raw) > _MAX_TAR_BYTES:
            raise ValidationError(f"{name}: bundle expands past {_MAX_TAR_BYTES} bytes")
        files: dict[str, bytes] = {}
        total = 0
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_BUNDLE_FILES:
                    raise ValidationError(f"{name}: more than {MAX_BUNDLE_FILES} entries")
                if not member.isfile():
                    continue
                path = _normal(member.name)
                if path is None:
                    raise ValidationError(f"{name}: {member.name!r} is not a usable bundle path")
                total += member.size
                if total > MAX_BUNDLE_BYTES:
                    raise ValidationError(f"{name}: bundle is larger than {MAX_BUNDLE_BYTES} bytes")
                if path in files:  # which copy was signed and which is loaded must never differ
                    raise ValidationError(f"{name}: {path} appears twice in the tarball")
                fh = tar.extractfile(member)
                files[path] = fh.read() if fh else b""
    except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:  # zlib.error: corrupt gzip data
        raise ValidationError(f"{name}: not a readable tarball ({exc})") from None
    return strip_top_directory(files)  # as the loader does


def policy_files(files: dict[str, bytes]) -> list[str]:
    """A bundle's files but its `.manifest` and `.signatures.json`."""
    return [name for name in files if name not in (".manifest", SIGNATURES_FILE)]


def yaml_bundle_file(files: dict[str, bytes]) -> str | None:
    """The one YAML bundle file of a tarball or directory's files that hold no `.rego` module and
    exactly one YAML file other than `data.yaml` (beside an optional `.manifest` and
    `.signatures.json`); None when the files are not such a YAML bundle."""
    policy = policy_files(files)
    if any(name.endswith(".rego") for name in policy):
        return None
    yamls = [n for n in policy if n.endswith((".yaml", ".yml")) and n.rsplit("/", 1)[-1] not in
             ("data.yaml", "data.yml")]
    return yamls[0] if len(yamls) == 1 and len(policy) == 1 else None


# -- signing and verifying -------------------------------------------------------------------


def _jwt() -> Any:
    # PyJWT pulls in `cryptography` (a large import): only signing and verifying need it, not
    # every `regent policy` run that merely imports this module.
    import jwt

    return jwt


def sign_bundle_files(files: dict[str, bytes], key: str, *, algorithm: str = "RS256", key_id: str | None = None,
                      scope: str | None = None, claims: dict[str, Any] | None = None) -> str:
    """The text of `.signatures.json` for these files (as `opa sign` writes it)."""
    if algorithm not in ALGORITHMS:
        raise ValidationError(f"unsupported signature algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})")
    payload: dict[str, Any] = {"files": bundle_file_hashes(files)}
    payload.update(claims or {})
    if scope is not None:
        payload["scope"] = scope
    headers = {"kid": key_id} if key_id else None
    if key_id:
        payload.setdefault("keyid", key_id)  # OPA's deprecated claim, for older verifiers
    payload.setdefault("iat", int(time.time()))
    jwt = _jwt()
    try:
        token = jwt.encode(payload, key, algorithm=algorithm, headers=headers)
    except (ValueError, TypeError, jwt.PyJWTError) as exc:
        raise ValidationError(f"cannot sign with this key and {algorithm}: {exc}") from None
    return json.dumps({"signatures": [token]}, indent=1) + "\n"


def _token_of(text: bytes) -> str:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SignatureRefused("signature_malformed", f"{SIGNATURES_FILE} is not JSON ({exc})") from None
    sigs = doc.get("signatures") if isinstance(doc, dict) else None
    if not isinstance(sigs, list) or not sigs:
        raise SignatureRefused("signature_malformed", f"{SIGNATURES_FILE}: missing JWT (expected exactly one)")
    if len(sigs) > 1:
        raise SignatureRefused("signature_malformed", f"{SIGNATURES_FILE}: multiple JWTs not supported "
                               "(expected exactly one)")
    if not isinstance(sigs[0], str):
        raise SignatureRefused("signature_malformed", f"{SIGNATURES_FILE}: the JWT must be a string")
    return sigs[0]


def verify_bundle_files(files: dict[str, bytes], keys: list[VerificationKey] | VerificationKey | None, *,
                        require: bool = True, default_key_id: str | None = None) -> dict[str, Any] | None:
    """Check the bundle's signature; returns its verified claims, or None for an unsigned bundle
    when no key is configured. Raises SignatureRefused with the reason. With several keys, the
    signature's key id picks one; ``default_key_id`` is used when it names none (OPA's
    ``signing.keyid``)."""
    keyset = [keys] if isinstance(keys, VerificationKey) else list(keys or [])
    signatures = files.get(SIGNATURES_FILE)
    if signatures is None:
        if keyset and require:
            raise SignatureRefused("signature_missing", f"bundle has no {SIGNATURES_FILE} and a "
                                   "verification key is configured")
        return None
    if not keyset:
        raise SignatureRefused("signature_unexpected", "the bundle is signed but no verification key "
                               "is configured")
    claims = verify_token(_token_of(signatures), keyset, default_key_id=default_key_id)
    _check_files(files, claims.get("files"))
    return claims


def verify_token(token: str, keys: list[VerificationKey], *, default_key_id: str | None = None) -> dict[str, Any]:
    """The JWT alone: key id, signature, expiry and scope; returns its claims."""
    keyset = list(keys)
    jwt = _jwt()
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise SignatureRefused("signature_malformed", f"the JWT cannot be read ({exc})") from None
    kid = header.get("kid") or unverified.get("keyid")
    key = _pick(keyset, kid if isinstance(kid, str) and kid else default_key_id)
    try:
        claims = jwt.decode(token, key.key, algorithms=[key.algorithm],
                            options={"require": [], "verify_aud": False})
    except jwt.ExpiredSignatureError:
        raise SignatureRefused("signature_expired", "the signature has expired (exp)") from None
    except jwt.ImmatureSignatureError:
        raise SignatureRefused("signature_expired", "the signature is not valid yet (nbf/iat)") from None
    except (jwt.PyJWTError, ValueError, TypeError) as exc:
        raise SignatureRefused("signature_invalid", f"the JWT does not verify with key "
                               f"{key.key_id or '(default)'} and {key.algorithm} ({exc})") from None
    want_scope = key.scope or ""
    got_scope = claims.get("scope") or ""
    if not hmac.compare_digest(str(got_scope).encode("utf-8", "surrogatepass"), want_scope.encode()):
        raise SignatureRefused("scope_mismatch", f"scope {got_scope!r} is not the configured scope "
                               f"{want_scope!r}")
    return claims


def _pick(keyset: list[VerificationKey], kid: str | None) -> VerificationKey:
    if kid is not None:
        for k in keyset:
            # surrogatepass: a JWT's JSON may name a lone surrogate, which no configured id holds
            if k.key_id is not None and hmac.compare_digest(k.key_id.encode(), kid.encode("utf-8", "surrogatepass")):
                return k
        if len(keyset) == 1 and keyset[0].key_id is None:
            return keyset[0]  # one unnamed key: whatever name the signer gave
        raise SignatureRefused("key_unknown", f"the signature names key id {kid!r}, which is not configured")
    if len(keyset) == 1:
        return keyset[0]
    raise SignatureRefused("key_unknown", "the signature names no key id and several keys are configured")


def _check_files(files: dict[str, bytes], listed: Any) -> None:
    if not isinstance(listed, list) or not all(isinstance(f, dict) for f in listed):
        raise SignatureRefused("signature_malformed", "the JWT has no files claim")
    signed: dict[str, dict[str, Any]] = {}
    for f in listed:
        name = f.get("name")
        if not isinstance(name, str):
            raise SignatureRefused("signature_malformed", "a files entry has no name")
        signed[name.lstrip("/")] = f
    for name in sorted(files):
        if name == SIGNATURES_FILE:
            continue
        entry = signed.pop(name, None)
        if entry is None:
            raise SignatureRefused("file_unsigned", f"file {name} is not included in the bundle signature")
        algorithm = entry.get("algorithm")
        if not algorithm:
            raise SignatureRefused("signature_malformed", f"no hashing algorithm provided for file {name}")
        try:
            got = file_hash(name, files[name], str(algorithm))
        except ValidationError as exc:
            raise SignatureRefused("digest_mismatch", exc.message) from None
        want = str(entry.get("hash", ""))
        if not hmac.compare_digest(got.encode(), want.lower().encode()):
            raise SignatureRefused("digest_mismatch", f"{name}: digest mismatch")
    if signed:
        raise SignatureRefused("file_missing", f"file(s) {sorted(signed)} specified in the bundle signature "
                               "but not found in the bundle")
