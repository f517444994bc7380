"""Synthetic environments a tiny model can learn on a CPU: arithmetic (``arith``) and a calculator tool (``tool``)."""
