"""Inference engines behind one Protocol (``base.InferenceEngine``): ``vllm`` and ``hf``."""
