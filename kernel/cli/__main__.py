"""`python -m kernel.cli` is the `regent` console script."""

import sys

from kernel.cli import main

sys.exit(main())
