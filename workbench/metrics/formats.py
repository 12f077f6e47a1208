"""One number format per kind of quantity, shared by the accuracy table, the explorer's readout
and the figures (hover templates and cell text use the same specs: d3-format reads them too).
"""

from __future__ import annotations

import math

# Errors span decades: three significant digits in scientific notation. Cosine and relative L2
# sit near 1 and 0 where the digits that differ come late.
NUMBER_FORMATS = {
    "mse": ".3e",
    "max_abs": ".3e",
    "drift": ".3e",
    "rel_l2": ".5f",
    "cosine": ".6f",
    "sqnr_db": ".2f",
    "fraction": ".4f",
    "benefit": ".2f",
    # media (workbench.metrics.media's table uses the same digits)
    "psnr_db": ".2f",
    "ssim": ".4f",
    "frame_cosine": ".6f",
    "diff": ".4f",
}


def fmt(value: float, kind: str) -> str:
    """`value` in the format of `kind` ("mse", "cosine", ...); nan / inf as words."""
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return str(value)
    return format(value, NUMBER_FORMATS[kind])


def fmt_benefit(b: float) -> str:
    """A benefit in percent; a near-total removal of the error shows as >99.99999%."""
    if math.isfinite(b) and b > 99.99999:
        return ">99.99999%"
    return fmt(b, "benefit") + "%"
