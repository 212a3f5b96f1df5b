"""`python -m server` is `tolk serve`."""

import sys

from server.cli import main

if __name__ == "__main__":  # a scheduler process (spawned) imports this module again, and must not serve
    sys.exit(main(["serve", *sys.argv[1:]]))
