"""Hidden tests for banking."""

import pytest
from banking import Account, transfer


def test_overdraft_is_refused_and_balances_unchanged():
    """100 cents cannot pay 500."""
    alice, bob = Account("alice", 100), Account("bob", 0)
    with pytest.raises(ValueError):
        transfer(alice, bob, 500)
    assert (alice.balance, bob.balance) == (100, 0)


def test_valid_transfer_moves_money():
    """Exactly the whole balance may be moved."""
    alice, bob = Account("alice", 100), Account("bob", 5)
    transfer(alice, bob, 100)
    assert (alice.balance, bob.balance) == (0, 105)
