"""`python -m vitfast.cli ...`, the same as the `vitfast` script."""

import sys

from .main import main

if __name__ == "__main__":  # importing this module (e.g. walking the package) runs nothing
    sys.exit(main())
