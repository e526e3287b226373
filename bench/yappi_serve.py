"""`python -m kernel serve` under yappi (CPU clock, every thread), for bench/profile.py --yappi.

    python -m bench.yappi_serve OUT.txt serve --db-url … --host … --port …

The function table (total and own CPU per function, all threads together) is written to OUT.txt
when the server stops, and the same profile as OUT.txt.pstat, for `pstats` (who calls what:
`pstats.Stats("OUT.txt.pstat").print_callers("get")`); also on SIGUSR1, for a server that an open
stream keeps from stopping in time (an MCP client's GET stream: `regent mcp serve`, `--mcp`):

    python -m bench.yappi_serve OUT.txt mcp serve --config … --kernel … --port …
"""

from __future__ import annotations

import signal
import sys
import threading

import yappi

_WRITTEN = threading.Lock()


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True, profile_threads=True)
    signal.signal(signal.SIGUSR1, lambda *_: _write(out))
    from kernel.cli import main as regent

    try:
        return regent(argv)
    finally:
        _write(out)


def _write(out: str) -> None:
    if not _WRITTEN.acquire(blocking=False):
        return
    yappi.stop()
    stats = yappi.get_func_stats()
    stats.save(out + ".pstat", type="pstat")
    with open(out, "w") as f:
        stats.sort("ttot").print_all(out=f, columns={0: ("name", 90), 1: ("ncall", 10), 2: ("tsub", 8),
                                                      3: ("ttot", 8), 4: ("tavg", 8)})
        f.write("\n\n--- by own time ---\n")
        stats.sort("tsub").print_all(out=f, columns={0: ("name", 90), 1: ("ncall", 10), 2: ("tsub", 8),
                                                      3: ("ttot", 8), 4: ("tavg", 8)})
        f.write("\n\n--- threads ---\n")
        yappi.get_thread_stats().print_all(out=f)


if __name__ == "__main__":
    sys.exit(main())
