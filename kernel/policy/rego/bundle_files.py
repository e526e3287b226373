"""A Rego bundle's files, read within the bounds: a directory walked (no symlinks) or a tarball read
in memory (no links, nothing written to disk), every path checked to stay inside the bundle."""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import re
import tarfile
import zlib
from pathlib import Path

from kernel.errors import ValidationError

MAX_BUNDLE_BYTES = 4 * 1024 * 1024  # every file of the bundle, uncompressed
MAX_BUNDLE_FILES = 1000
# A tarball may not expand past this (headers and padding on top of the files themselves).
MAX_TAR_BYTES = 2 * MAX_BUNDLE_BYTES + 1024 * MAX_BUNDLE_FILES
DATA_FILES = ("data.json", "data.yaml", "data.yml")


def bundle_error(problems: list[str] | str) -> ValidationError:
    lines = [problems] if isinstance(problems, str) else problems
    return ValidationError(
        "invalid policy bundle: " + "\n".join(lines), details={"problems": lines}
    )


def read_directory(root: Path) -> dict[str, bytes]:
    """The bundle's wanted files under ``root`` (path → bytes); raises ValidationError."""
    files: dict[str, bytes] = {}
    problems: list[str] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for d in list(dirnames):
            if (Path(dirpath) / d).is_symlink():
                problems.append(
                    f"{(Path(dirpath) / d).relative_to(root)}: symlinks are not allowed"
                )
                dirnames.remove(d)
        for fname in sorted(filenames):
            full = Path(dirpath) / fname
            rel = full.relative_to(root).as_posix()
            if full.is_symlink():
                problems.append(f"{rel}: symlinks are not allowed")
                continue
            if not full.is_file():
                continue
            if len(files) >= MAX_BUNDLE_FILES:
                raise bundle_error(f"{root}: more than {MAX_BUNDLE_FILES} files")
            total += full.stat().st_size
            if total > MAX_BUNDLE_BYTES:
                raise bundle_error(f"{root}: bundle is larger than {MAX_BUNDLE_BYTES} bytes")
            if wanted(rel):
                files[rel] = full.read_bytes()
    if problems:
        raise bundle_error(problems)
    return files


def read_tarball(raw: bytes, name: str) -> dict[str, bytes]:
    """The files of a `.tar.gz` (or plain `.tar`) bundle, a lone top directory stripped; raises
    ValidationError naming ``name``."""
    try:
        if raw[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
                raw = gz.read(MAX_TAR_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:  # zlib.error: a gzip header over corrupt data
        raise bundle_error(f"{name}: not a gzip file ({exc})") from None
    if len(raw) > MAX_TAR_BYTES:
        raise bundle_error(f"{name}: bundle expands past {MAX_TAR_BYTES} bytes")
    files: dict[str, bytes] = {}
    problems: list[str] = []
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_BUNDLE_FILES:
                    raise bundle_error(f"{name}: more than {MAX_BUNDLE_FILES} entries")
                path = safe_path(member.name, problems, allow_dot=True)
                if path is None:
                    continue
                if member.isdir():
                    continue
                if not member.isfile():
                    problems.append(f"{path}: links and special files are not allowed in a bundle")
                    continue
                total += member.size
                if total > MAX_BUNDLE_BYTES:
                    raise bundle_error(f"{name}: bundle is larger than {MAX_BUNDLE_BYTES} bytes")
                if path in files:
                    problems.append(f"{path}: appears twice in the tarball")
                    continue
                extracted = tar.extractfile(member)
                files[path] = extracted.read() if extracted else b""
    except tarfile.TarError as exc:
        raise bundle_error(f"{name}: not a readable tarball ({exc})") from None
    if problems:
        raise bundle_error(problems)
    return strip_top_directory(files)


def wanted(path: str) -> bool:
    base = posixpath.basename(path)
    return (
        path == ".manifest"
        or (base.endswith(".rego") and not base.endswith("_test.rego"))
        or base in DATA_FILES
    )


def strip_top_directory(files: dict[str, bytes]) -> dict[str, bytes]:
    """`tar czf shell.tar.gz shell/` puts everything under `shell/`: that directory is the bundle."""
    if ".manifest" in files or not files:
        return files
    tops = {p.split("/", 1)[0] for p in files}
    if len(tops) == 1 and all("/" in p for p in files):
        top = tops.pop() + "/"
        return {p[len(top) :]: v for p, v in files.items()}
    return files


def safe_path(raw: object, problems: list[str], *, allow_dot: bool = False) -> str | None:
    if not isinstance(raw, str) or not raw or "\x00" in raw or "\\" in raw:
        problems.append(f"{raw!r}: not a usable bundle path")
        return None
    if raw.startswith("/") or re.match(r"^[A-Za-z]:", raw):
        problems.append(f"{raw}: absolute paths are not allowed in a bundle")
        return None
    parts = [p for p in raw.split("/") if p not in ("", ".")] if allow_dot else raw.split("/")
    if any(p == ".." for p in parts) or any(p in ("", ".") for p in parts):
        problems.append(f"{raw}: path escapes the bundle or is not normalised")
        return None
    if not parts:  # "./" itself
        return None
    return "/".join(parts)
