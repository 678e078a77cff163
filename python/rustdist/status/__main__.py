"""``python -m rustdist.status HOST:PORT``: see :mod:`rustdist.status`."""

import sys

from . import main

sys.exit(main())
