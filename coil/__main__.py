"""``python -m coil report LOG`` / ``bench`` / ``demo``: the ``coil`` command (coil/cli.py)."""
import sys

from coil.cli import main

sys.exit(main())
