"""``train_dpo``: direct preference optimisation on prompt/chosen/rejected pairs (``dpo.data_path``) (``component.py``)."""
