"""Accounts and transfers."""

from banking.accounts import Account
from banking.transfers import transfer

__all__ = ["Account", "transfer"]
