"""A binary tree node and recursive measures of a tree."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TreeNode:
    """One node of a binary tree."""

    value: int
    left: TreeNode | None = None
    right: TreeNode | None = None


def height(node: TreeNode | None) -> int:
    """Return the number of levels of the tree rooted at ``node``."""
    if node is None:
        return 1
    return 1 + max(height(node.left), height(node.right))


def size(node: TreeNode | None) -> int:
    """Return the number of nodes of the tree rooted at ``node``."""
    if node is None:
        return 0
    return 1 + size(node.left) + size(node.right)
