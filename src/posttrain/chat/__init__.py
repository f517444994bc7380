"""The chat format: how conversations become token ids (shared by episodes, SFT and DPO)."""
