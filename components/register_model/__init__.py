"""``register_model``: MLflow registration with lineage and champion promotion (``component.py``)."""
