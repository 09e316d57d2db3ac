"""Per-word attention maps drawn over the image, in the style of Xu et al. 2015 (Figures 2, 3).

One PNG per image, titled with the caption: the image first (untitled), then
one panel per generated word with that step's attention map smoothly
upsampled and lighting the image, the word as the panel title. Matplotlib's
Agg canvas only (no pyplot global state), so it is safe from worker threads
and needs no display. Used by the gRPC client (`captioner caption
--attention-out`) and by the Evaluator's figures.
"""
from __future__ import annotations

import io
import math
import os
from typing import Optional, Sequence

import numpy as np
from PIL import Image

PANEL_INCHES = 1.6
TITLE_INCHES = 0.3      # room above each panel for its word
MAX_COLUMNS = 6
DPI = 100
# Images are drawn at most this many pixels on a side: a panel is
# PANEL_INCHES * DPI = 160 px wide, so a 4000x3000 photo costs what a small one does.
MAX_DRAWN_PIXELS = 2 * int(PANEL_INCHES * DPI)


def upsample_attention(attention_map: np.ndarray, height: int, width: int) -> np.ndarray:
    """A smooth (bicubic) upsampling of an (h, w) map to (height, width), scaled to [0, 1]."""
    m = np.asarray(attention_map, np.float32)
    resized = np.asarray(Image.fromarray(m).resize((width, height), Image.BICUBIC))
    resized = np.clip(resized, 0.0, None)
    top = float(resized.max())
    return resized / top if top > 0 else resized


def _panel_image(image: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8, downscaled once so its longer side is at most `MAX_DRAWN_PIXELS`."""
    image = np.asarray(image)
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=-1)
    if image.ndim != 3 or image.shape[-1] < 3:
        raise ValueError(f"image must be (H, W, 3), got {image.shape}")
    image = image[..., :3].astype(np.uint8)
    h, w = image.shape[:2]
    scale = MAX_DRAWN_PIXELS / max(h, w)
    if scale < 1.0:
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = np.asarray(Image.fromarray(image).resize(size, Image.BILINEAR))
    return image


def render_attention_figure(image: np.ndarray, words: Sequence[str], attention: np.ndarray,
                            title: Optional[str] = None, columns: int = MAX_COLUMNS):
    """The figure of `attention_figure`, not yet written (a matplotlib `Figure`).

    The first panel is the image itself, untitled, so it is never read as a
    word; every other panel's title is its word. The figure title defaults to
    the caption (the words joined), so the client's and the Evaluator's
    figures look alike. Constrained layout keeps every title clear of the
    row above it, whatever the number of rows.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    image = _panel_image(image)
    attention = np.asarray(attention, np.float32)
    if attention.ndim != 3:
        raise ValueError(f"attention must be (T, h, w), got {attention.shape}")
    words = [str(w) for w in words]
    if attention.shape[0] < len(words):
        raise ValueError(f"{len(words)} words but only {attention.shape[0]} attention maps")
    if title is None:
        title = " ".join(words)
    panels = len(words) + 1
    cols = max(1, min(columns, panels))
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(cols * PANEL_INCHES,
                          rows * (PANEL_INCHES + TITLE_INCHES) + (0.4 if title else 0.0)),
                 dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    h, w = image.shape[:2]
    base = image.astype(np.float32) / 255.0
    for k in range(rows * cols):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.set_axis_off()
        if k == 0:
            ax.imshow(image, interpolation="bilinear")
        elif k <= len(words):
            alpha = upsample_attention(attention[k - 1], h, w)[..., None]
            # dim what is not attended, brighten (towards white) what is
            lit = base * (0.25 + 0.75 * alpha) + 0.45 * alpha * (1.0 - base)
            ax.imshow(np.clip(lit, 0.0, 1.0), interpolation="bilinear")
            ax.set_title(words[k - 1], fontsize=10)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def attention_figure(image: np.ndarray, words: Sequence[str], attention: np.ndarray,
                     path: str, title: Optional[str] = None, columns: int = MAX_COLUMNS) -> str:
    """Writes a PNG: the image, then one panel per word with its attention over the image.

    Each word's panel shows the image lit by the smoothly upsampled attention
    map (bright = attended), the word as the panel title, as in the paper's
    Figures 2 and 3.

    Args:
      image: (H, W, 3) uint8 image (a 2-D grayscale image is also accepted);
        drawn downscaled to at most `MAX_DRAWN_PIXELS` on a side.
      words: the generated words; panel t shows `attention[t]`.
      attention: (T, h, w) maps with T >= len(words) (extra maps are ignored).
      path: where to write the PNG (parent folders are created).
      title: the figure title; the caption (the words joined) when None.
      columns: panels per row at most.
    Returns:
      `path`.
    """
    fig = render_attention_figure(image, words, attention, title=title, columns=columns)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png")
    return path


def save_attention_figure(image_bytes: bytes, words: Sequence[str], attention: np.ndarray,
                          path: str, title: Optional[str] = None,
                          columns: int = MAX_COLUMNS) -> str:
    """`attention_figure` for encoded image bytes (what the client sent to the server).

    Attention maps beyond the words (`<end>`, padding) are ignored. A JPEG is
    decoded at reduced size when it is much larger than a panel (`draft`).
    """
    with Image.open(io.BytesIO(image_bytes)) as decoded:
        decoded.draft("RGB", (MAX_DRAWN_PIXELS, MAX_DRAWN_PIXELS))
        image = np.asarray(decoded.convert("RGB"))
    attention = np.asarray(attention, np.float32)
    words = list(words)[:attention.shape[0]] if attention.ndim == 3 else []
    if attention.ndim != 3:
        attention = np.zeros((0, 1, 1), np.float32)
    return attention_figure(image, words, attention, path, title=title, columns=columns)
