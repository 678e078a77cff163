"""``python -m rustdist.flight_recorder DIR``: the timeline of the dumps in DIR."""

import sys

from . import main

sys.exit(main())
