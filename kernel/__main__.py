"""`python -m kernel` is the `regent` console script."""

from kernel.cli import main

raise SystemExit(main())
