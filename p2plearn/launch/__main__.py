"""``python -m p2plearn.launch``: the same as ``p2plearn-run``."""

import sys

from .run import main

sys.exit(main())
