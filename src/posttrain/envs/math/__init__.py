"""Math environments and answer checking.

Modules: ``answers`` (final-answer extraction and exact numbers), ``verify`` (``verify_answer``:
math-verify with a deadline), ``verifier_pool`` (its worker subprocesses), ``gsm8k`` (GSM8K) and
``math_tool`` (math with a Python tool).
"""
