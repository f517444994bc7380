"""Hidden tests for confmerge."""

from confmerge import deep_merge


def test_nested_sections_merge():
    """db.host survives, db.port is overridden, new keys are added."""
    base = {"db": {"host": "a", "port": 1}, "debug": False}
    override = {"db": {"port": 2}, "name": "x"}
    assert deep_merge(base, override) == {"db": {"host": "a", "port": 2}, "debug": False, "name": "x"}


def test_inputs_are_not_changed():
    """The base dictionary and its nested sections stay as they were."""
    base = {"db": {"host": "a"}}
    deep_merge(base, {"db": {"host": "b"}})
    assert base == {"db": {"host": "a"}}


def test_scalar_override_replaces_section():
    """A non-dict value replaces a dict."""
    assert deep_merge({"db": {"host": "a"}}, {"db": None}) == {"db": None}
