"""Hidden tests for slugs."""

from slugs import slugify


def test_punctuation_at_the_end_leaves_no_dash():
    """The comma and the exclamation mark disappear."""
    assert slugify("Hello, World!") == "hello-world"


def test_spaces_collapse_and_ends_are_trimmed():
    """Leading, trailing and repeated spaces give no extra dashes."""
    assert slugify("  Many   spaces  here ") == "many-spaces-here"


def test_existing_slug_is_unchanged():
    """A slug is its own slug."""
    assert slugify("already-a-slug") == "already-a-slug"
