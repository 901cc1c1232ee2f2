"""``python -m testbed.cli``: the command line."""

import sys

from testbed.cli import main

sys.exit(main())
