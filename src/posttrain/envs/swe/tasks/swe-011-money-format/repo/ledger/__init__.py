"""Money amounts in cents."""

from ledger.money import format_cents

__all__ = ["format_cents"]
