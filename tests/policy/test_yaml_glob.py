"""Target globs (rebuno-v0.md §3.3): path.Match syntax, whole-string, wildcards cross `/`."""

from __future__ import annotations

import pytest

from kernel.policy.yaml.glob import GlobError, compile_glob

MATCHES = [
    ("shell_exec", "shell_exec", True),
    ("shell_exec", "shell_exec2", False),
    ("shell_exec", "Shell_exec", False),
    ("mcp/*delete", "mcp/nested/fs_delete", True),
    ("mcp/*delete", "mcp/delete", True),
    ("mcp/*delete", "mcp/fs_delete_now", False),
    ("mcp/*", "mcp/", True),
    ("mcp/*", "mcp", False),
    ("*", "", True),
    ("*", "a/b\nc", True),
    ("**", "a/b/c", True),
    ("a**b", "ab", True),
    ("a*b*c", "abc", True),
    ("a*b*c", "a_b_b_c", True),
    ("a*b*c", "acb", False),
    ("a*ab", "aab", True),
    ("ab*ba", "aba", False),
    ("*.txt", "notes.txt", True),
    ("*.txt", "notes_txt", False),
    ("x.+(y)", "x.+(y)", True),
    ("x.+(y)", "xx+(y)", False),
    ("a?c", "abc", True),
    ("a?c", "a/c", True),
    ("a?c", "a\nc", True),
    ("a?c", "aéc", True),
    ("a?c", "a😀c", True),
    ("a?c", "ac", False),
    ("a?c", "abbc", False),
    ("x[a\\-z]", "x-", True),
    ("x[a\\-z]", "xa", True),
    ("x[a\\-z]", "xz", True),
    ("x[a\\-z]", "xb", False),
    ("x[a-z]", "xb", True),
    ("x[a-z]", "xB", False),
    ("x[^a-z]", "xB", True),
    ("x[^a-z]", "xb", False),
    ("x[^a-z]", "x/", True),
    ("x[^a-z]", "x\n", True),
    ("x[!a]", "x!", True),
    ("x[!a]", "xa", True),
    ("x[!a]", "xb", False),
    ("[]a]", None, None),  # see MALFORMED
    ("x[a^]", "x^", True),
    ("x[*?[]", "x*", True),
    ("x[*?[]", "x[", True),
    ("x[*?[]", "xa", False),
    ("x[/]", "x/", True),
    ("x[é-ê]", "xê", True),
    ("x[z-a]", "xa", False),  # Go accepts a reversed range; it matches nothing
    ("x[^z-a]", "xa", True),
    ("\\*", "*", True),
    ("\\*", "a", False),
    ("a\\?c", "a?c", True),
    ("a\\?c", "abc", False),
    ("\\[x]", "[x]", True),
    ("a]b", "a]b", True),
    ("a^b", "a^b", True),
    ("tool_[0-9]*", "tool_7/anything", True),
    ("tool_[0-9]*", "tool_x", False),
    ("", "", True),
    ("", "a", False),
]


@pytest.mark.parametrize(
    ("pattern", "target", "expected"),
    [m for m in MATCHES if m[1] is not None],
    ids=[f"{p!r}~{t!r}" for p, t, _ in MATCHES if t is not None],
)
def test_glob_matches_whole_target(pattern: str, target: str, expected: bool) -> None:
    assert compile_glob(pattern).match(target) is expected


MALFORMED = [
    ("x[", "unterminated character class"),
    ("x[a", "unterminated character class"),
    ("x[a-", "unterminated character class"),
    ("x[a-z", "unterminated character class"),
    ("x[^", "unterminated character class"),
    ("[]a]", "empty character class"),
    ("[]", "empty character class"),
    ("[^]a]", "empty character class"),
    ("[-a]", 'leading "-"'),
    ("[^-a]", 'leading "-"'),
    ("[a-]", 'dangling "-"'),
    ("[a--]", 'dangling "-"'),
    ("[a-z-x]", 'unexpected "-"'),
    ("abc\\", 'trailing "\\\\"'),
    ("[a\\", 'trailing "\\\\"'),
]


@pytest.mark.parametrize(("pattern", "message"), MALFORMED, ids=[p for p, _ in MALFORMED])
def test_glob_rejects_malformed_pattern(pattern: str, message: str) -> None:
    with pytest.raises(GlobError, match=message):
        compile_glob(pattern)


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        ("shell_exec", "shell_exec"),
        ("a\\*b", "a*b"),
        ("a\\[b", "a[b"),
        ("a]b", "a]b"),
        ("*", None),
        ("a?", None),
    ],
    ids=["plain", "escaped-star", "escaped-bracket", "close-bracket", "star", "question"],
)
def test_glob_without_metacharacters_is_plain_equality(pattern: str, literal: str | None) -> None:
    assert compile_glob(pattern).literal == literal


@pytest.mark.parametrize(
    ("pattern", "universal"), [("*", True), ("***", True), ("*a", False), ("", False)]
)
def test_glob_made_of_stars_matches_everything(pattern: str, universal: bool) -> None:
    assert compile_glob(pattern).universal is universal


def test_glob_with_class_matches_target_with_lone_surrogate() -> None:
    # Go's JSON decoder turns a lone surrogate escape into U+FFFD before policy sees it.
    assert compile_glob("a?").match("a\ud800") is True
    assert compile_glob("a[\ufffd]").match("a\ud800") is True


@pytest.mark.parametrize(
    ("pattern", "prefix"),
    [("tool_9*", "tool_9"), ("mcp/fs_?", "mcp/fs_"), ("a[bc]d", "a"), ("\\*x*", "*x"), ("*x", ""),
     ("?x", ""), ("[a]x", ""), ("plain", "plain"), ("*", "")],
    ids=["star", "any", "class", "escaped-star", "leading-star", "leading-any", "leading-class",
         "literal", "universal"],
)
def test_glob_prefix_is_the_literal_run_every_match_starts_with(pattern: str, prefix: str) -> None:
    assert compile_glob(pattern).prefix == prefix
