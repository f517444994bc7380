"""``train_sft``: supervised fine-tuning on chat rows (``sft.data_path``) (``component.py``)."""
