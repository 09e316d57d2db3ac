"""Checks shared by the tests of the built-in synthetic sources."""
import io

import numpy as np
from PIL import Image

from components.contract.raw_example import RawExample


def decoded_png_example(ex, image_id: str, size: int) -> np.ndarray:
    """Asserts `ex` is an in-memory PNG `RawExample` named `image_id`; returns its pixels."""
    assert isinstance(ex, RawExample)
    assert ex.image_id == image_id and ex.image_path is None and ex.split is None
    assert ex.image_bytes[:8] == b"\x89PNG\r\n\x1a\n"
    image = np.asarray(Image.open(io.BytesIO(ex.image_bytes)))
    assert image.shape == (size, size, 3) and image.dtype == np.uint8
    return image


def check_object(o: dict, sizes: dict) -> tuple[float, float]:
    """Asserts `o`'s box is inside the image and its height in its size's range; returns (h, w)."""
    ymin, xmin, ymax, xmax = o["bbox"]
    assert 0 <= ymin < ymax <= 1 and 0 <= xmin < xmax <= 1
    lo, hi = sizes[o["size"]]
    assert lo - 1e-5 <= ymax - ymin <= hi + 1e-5
    return ymax - ymin, xmax - xmin
