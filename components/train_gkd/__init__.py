"""``train_gkd``: GKD, on-policy distillation of a teacher into the student (``component.py``)."""
