"""Per-word attention maps drawn over the original image (Xu et al. 2015, fig. 2-3).

One PNG per image: the image first, then one panel per generated word with
that step's attention map upsampled to the image size and overlaid, the
word as the panel title. Uses matplotlib's Agg canvas directly (no pyplot
global state), so it is safe from worker threads and needs no display.
"""
from __future__ import annotations

import io
import math
from typing import Sequence

import numpy as np


def upsample(attention_map: np.ndarray, width: int, height: int) -> np.ndarray:
    """Bilinear upsampling of an (H, W) map to (height, width), scaled to [0, 1]."""
    from PIL import Image

    grid = np.asarray(attention_map, dtype=np.float32)
    image = Image.fromarray(grid, mode="F").resize((width, height), Image.BILINEAR)
    out = np.asarray(image, dtype=np.float32)
    low, high = float(out.min()), float(out.max())
    return (out - low) / (high - low) if high > low else np.zeros_like(out)


def save_attention_figure(image_bytes: bytes, words: Sequence[str], attention: np.ndarray,
                          path: str, columns: int = 5, panel_inches: float = 2.2) -> str:
    """Writes the image and one attention overlay per word to a PNG.

    Args:
      image_bytes: the encoded image that was captioned.
      words: the caption's words (panel titles), in generation order.
      attention: (T, H, W) maps, step t for word t; extra steps (`<end>`,
        padding) are ignored.
      path: the PNG to write.
      columns: panels per row.
    Returns:
      `path`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(image_bytes)).convert("RGB"))
    height, width = image.shape[:2]
    attention = np.asarray(attention)
    steps = min(len(words), attention.shape[0]) if attention.ndim == 3 else 0
    panels = 1 + steps
    columns = max(1, min(columns, panels))
    rows = math.ceil(panels / columns)
    figure = Figure(figsize=(panel_inches * columns, panel_inches * rows))
    FigureCanvasAgg(figure)
    for index in range(rows * columns):
        axes = figure.add_subplot(rows, columns, index + 1)
        axes.axis("off")
        if index >= panels:
            continue
        axes.imshow(image)
        if index == 0:
            axes.set_title("image", fontsize=10)
            continue
        overlay = upsample(attention[index - 1], width, height)
        axes.imshow(overlay, cmap="jet", alpha=0.5, vmin=0.0, vmax=1.0,
                    extent=(-0.5, width - 0.5, height - 0.5, -0.5))
        axes.set_title(words[index - 1], fontsize=10)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=80)
    return path
