"""Hidden tests for versions."""

from versions import is_newer, parse_version


def test_parts_compare_as_numbers():
    """10 > 9 and 2.0 > 1.99."""
    assert is_newer("1.10.0", "1.9.0")
    assert is_newer("2.0", "1.99")
    assert not is_newer("1.9.0", "1.10.0")


def test_equal_versions_are_not_newer():
    """A version is not newer than itself; parts parse to integers."""
    assert not is_newer("3.1.4", "3.1.4")
    assert parse_version("3.1.4") == (3, 1, 4)
