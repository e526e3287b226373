"""`python -m reliability` = `regent chaos`."""

import sys

from reliability.run import main

sys.exit(main(sys.argv[1:]))
