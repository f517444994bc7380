"""Model loading shared by every role: tiny models built from a config, real ones from a directory (``hf``)."""
