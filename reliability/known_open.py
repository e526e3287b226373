"""Defects the suite finds that are known and being fixed elsewhere: (substring of a failed
item, where it is tracked). A check whose every failure is listed here holds, shown in yellow
with the reason; anything else still fails the run. Remove an entry when its fix lands (the run
says when an entry no longer matched anything)."""

KNOWN_OPEN: list[tuple[str, str]] = []
