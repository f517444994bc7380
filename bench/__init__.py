"""Benchmarks (not tests): each module runs with ``.venv/bin/python -m bench.<name>`` and writes bench/results/."""
