"""`regent policy sign` writes a bundle's `.signatures.json` (OPA's format); `regent policy check
--verify-key` checks one before the load gate. Exit codes: 0 done, 1 a bundle, key or signature
was refused (the message names the file and the reason)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kernel.cli.common import console
from kernel.errors import ValidationError
from kernel.policy.signature import (
    ALGORITHMS,
    SIGNATURES_FILE,
    VerificationKey,
    read_bundle_files,
    read_key,
    sign_bundle_files,
    verify_bundle_files,
)


def cmd_sign(args: argparse.Namespace) -> int:
    bundle = Path(args.bundle)
    if not bundle.is_dir():
        console.print(f"[red]{bundle}: not a bundle directory (sign the directory, then build the tarball)[/]")
        return 1
    try:
        claims: dict[str, Any] = {}
        if args.claims_file:
            try:
                claims = json.loads(Path(args.claims_file).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ValidationError(f"{args.claims_file}: cannot read the claims file ({exc})") from None
            if not isinstance(claims, dict):
                raise ValidationError(f"{args.claims_file}: the claims file must hold a JSON object")
        files = read_bundle_files(bundle)
        text = sign_bundle_files(files, read_key(args.signing_key), algorithm=args.signing_alg,
                                 key_id=args.key_id, scope=args.scope, claims=claims)
    except ValidationError as exc:
        console.print(f"[red]{exc.message}[/]")
        return 1
    out = Path(args.output) if args.output else bundle
    target = out / SIGNATURES_FILE if out.is_dir() else out
    target.write_text(text, encoding="utf-8")
    console.print(f"signed {len([f for f in files if f != SIGNATURES_FILE])} file(s) of {bundle} → {target}")
    return 0


def add_sign_command(ps: Any) -> None:
    s = ps.add_parser("sign", help="write a bundle directory's .signatures.json (OPA's format)")
    s.add_argument("bundle", help="the bundle directory")
    s.add_argument("--signing-key", required=True,
                   help="PEM private key file (RS*/PS*/ES*) or the HMAC secret itself (HS*)")
    s.add_argument("--signing-alg", default="RS256", choices=ALGORITHMS)
    s.add_argument("--key-id", help="key id, written as the JWT's kid (and keyid claim)")
    s.add_argument("--scope", help="scope claim the verifier must be configured with")
    s.add_argument("--claims-file", help="JSON object of extra claims (iss, exp, ...), as `opa sign`")
    s.add_argument("-o", "--output", help="where to write .signatures.json (default: into the bundle)")
    s.set_defaults(fn=cmd_sign)


def add_verify_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("--verify-key", help="check bundle signatures first: PEM public key file, or the HMAC "
                   "secret (HS*); an unsigned bundle is then refused")
    c.add_argument("--verify-alg", default="RS256", choices=ALGORITHMS)
    c.add_argument("--key-id", help="the key's id (a signature naming another is refused)")
    c.add_argument("--scope", help="the scope every signature must carry")


def verify_signature(args: argparse.Namespace, path: Path) -> str | None:
    """None when the bundle's signature verifies (or no key was given); else the message."""
    if not getattr(args, "verify_key", None):
        return None
    signed = path
    if path.suffix in (".yaml", ".yml") and (path.parent / SIGNATURES_FILE).is_file():
        signed = path.parent  # a YAML bundle signed in its directory, as a bundle server serves it tarred
    elif not (path.is_dir() or path.name.endswith((".tar.gz", ".tgz"))):
        return (f"{path}: a bare YAML file carries no signature: sign the directory holding it "
                "(regent policy sign DIR), as for a Rego bundle")
    try:
        key = VerificationKey(read_key(args.verify_key), args.verify_alg, args.key_id, args.scope)
        files = read_bundle_files(signed)
        if signed is not path and [n for n in files if n != SIGNATURES_FILE] != [path.name]:
            return (f"{path}: {signed} holds other files besides {path.name}; a signed YAML bundle's "
                    "directory holds that one file and .signatures.json")
        verify_bundle_files(files, key)
    except ValidationError as exc:
        return f"{path}: {exc.message}"
    return None
