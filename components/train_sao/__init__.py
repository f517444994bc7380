"""``train_sao``: SAO with local processes or one Kueue-admitted JobSet (``component.py``)."""
