"""Bank accounts holding integer cents."""

from dataclasses import dataclass


@dataclass
class Account:
    """An account's owner and balance in cents."""

    owner: str
    balance: int = 0
