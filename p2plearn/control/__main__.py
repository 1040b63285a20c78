"""``python -m p2plearn.control``: the coordinator in a process of its own (see ``server``)."""

import sys

from .server import main

sys.exit(main())
