"""``python -m bench.sim``: the simulator's check and projection (``bench.sim.project``)."""

from bench.sim.project import main

raise SystemExit(main())
