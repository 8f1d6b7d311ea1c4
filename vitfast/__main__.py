"""`python -m vitfast ...`, the same as the `vitfast` script: part of the command line, like `vitfast.cli.__main__`."""

import sys

from .cli.main import main

if __name__ == "__main__":  # importing this module (e.g. walking the package) runs nothing
    sys.exit(main())
