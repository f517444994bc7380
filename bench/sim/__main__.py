"""``python -m bench.sim``: the simulator's check and projection (``bench.sim.project``)."""

import sys

from bench.sim.project import main

sys.exit(main())
