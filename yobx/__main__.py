"""``python -m yobx``: the ``yobx`` command."""

import sys

from yobx.cli import main

if __name__ == "__main__":
    sys.exit(main())
