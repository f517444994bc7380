"""Hidden tests for treekit."""

from treekit import TreeNode, height, size


def test_empty_tree_and_leaf():
    """None has height 0; a leaf has height 1."""
    assert height(None) == 0
    assert height(TreeNode(1)) == 1


def test_unbalanced_tree():
    """Root -> left -> left.right: three levels, four nodes."""
    tree = TreeNode(1, left=TreeNode(2, right=TreeNode(3)), right=TreeNode(4))
    assert height(tree) == 3
    assert size(tree) == 4
