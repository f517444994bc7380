"""Equal-width histograms."""

from binning.hist import histogram

__all__ = ["histogram"]
