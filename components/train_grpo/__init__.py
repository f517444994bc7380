"""``train_grpo``: GRPO on environment tasks (group baseline; synchronous, or asynchronous with DIS when ``grpo.async``) (``component.py``)."""
