"""Count values into equal-width bins."""


def histogram(values: list[float], lo: float, hi: float, bins: int) -> list[int]:
    """Count ``values`` in ``bins`` equal bins over [lo, hi]; values outside are ignored."""
    if bins < 1 or not hi > lo:
        raise ValueError("need bins >= 1 and hi > lo")
    counts = [0] * bins
    width = (hi - lo) / bins
    for value in values:
        if value < lo or value > hi:
            continue
        index = int((value - lo) / width)
        counts[index] += 1
    return counts
