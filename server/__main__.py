"""`python -m server` is `tolk serve`."""

import sys

from server.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
