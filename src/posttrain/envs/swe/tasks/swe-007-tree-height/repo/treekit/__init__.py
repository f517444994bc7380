"""Binary tree helpers."""

from treekit.tree import TreeNode, height, size

__all__ = ["TreeNode", "height", "size"]
