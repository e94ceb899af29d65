"""`python -m hybridnet`: the `hybridnet` command line (hybridnet/cli.py)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
