"""``python -m p2plearn.testbed`` is ``p2plearn-testbed``."""

import sys

from p2plearn.testbed.cli import main

sys.exit(main())
