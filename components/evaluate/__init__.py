"""``evaluate``: held-out avg@k of a checkpoint with an HTML report (``component.py``)."""
