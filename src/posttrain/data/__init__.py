"""Dataset loading and validation, the local tokenizer, and chat rendering to token ids + action masks."""
