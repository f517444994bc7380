"""The cluster simulator: ``model`` (the event loop), ``calibrate`` (fit and check against measured runs), ``project``
(the command: check, then project to N GPUs), ``collect`` (the measurements it needs)."""
