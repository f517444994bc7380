"""``prepare_dataset``: resolve the run config with the per-run knobs and validate the data (``component.py``)."""
