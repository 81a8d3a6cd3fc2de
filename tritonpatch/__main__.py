"""``python -m tritonpatch``: the same command line as the ``tritonpatch`` console script."""
import sys

from .cli import main

sys.exit(main())
