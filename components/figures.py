"""Attention figures in the style of Xu et al. 2015 (Figures 2 and 3) and an HTML index.

Matplotlib's object API with the Agg canvas only (no pyplot state), so
figures can be drawn from any thread or process without a display.
"""
from __future__ import annotations

import html
import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np
from PIL import Image

PANEL_INCHES = 1.6
MAX_COLUMNS = 6
DPI = 100


def upsample_attention(attention_map: np.ndarray, height: int, width: int) -> np.ndarray:
    """A smooth (bicubic) upsampling of an (h, w) map to (height, width), scaled to [0, 1]."""
    m = np.asarray(attention_map, np.float32)
    resized = np.asarray(Image.fromarray(m).resize((width, height), Image.BICUBIC))
    resized = np.clip(resized, 0.0, None)
    top = float(resized.max())
    return resized / top if top > 0 else resized


def attention_figure(image: np.ndarray, words: Sequence[str], attention: np.ndarray,
                     path: str, title: Optional[str] = None) -> str:
    """Writes a PNG: the image, then one panel per word with its attention over the image.

    Each word's panel shows the image lit by the smoothly upsampled attention
    map (bright = attended), the word as the panel title, as in the paper's
    Figures 2 and 3.

    Args:
      image: (H, W, 3) uint8 image (a 2-D grayscale image is also accepted).
      words: the generated words; panel t shows `attention[t]`.
      attention: (T, h, w) maps with T >= len(words) (extra maps are ignored).
      path: where to write the PNG (parent folders are created).
      title: optional figure title (e.g. the caption and image id).
    Returns:
      `path`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    image = np.asarray(image)
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=-1)
    if image.ndim != 3 or image.shape[-1] < 3:
        raise ValueError(f"image must be (H, W, 3), got {image.shape}")
    image = image[..., :3].astype(np.uint8)
    attention = np.asarray(attention, np.float32)
    if attention.ndim != 3:
        raise ValueError(f"attention must be (T, h, w), got {attention.shape}")
    words = [str(w) for w in words]
    if attention.shape[0] < len(words):
        raise ValueError(f"{len(words)} words but only {attention.shape[0]} attention maps")
    panels = len(words) + 1
    cols = min(MAX_COLUMNS, panels)
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(cols * PANEL_INCHES, rows * PANEL_INCHES + (0.4 if title else 0.0)),
                 dpi=DPI)
    FigureCanvasAgg(fig)
    h, w = image.shape[:2]
    base = image.astype(np.float32) / 255.0
    for k in range(rows * cols):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.set_axis_off()
        if k == 0:
            ax.imshow(image, interpolation="bilinear")
            ax.set_title("image", fontsize=9)
        elif k <= len(words):
            alpha = upsample_attention(attention[k - 1], h, w)[..., None]
            # dim what is not attended, brighten (towards white) what is
            lit = base * (0.25 + 0.75 * alpha) + 0.45 * alpha * (1.0 - base)
            ax.imshow(np.clip(lit, 0.0, 1.0), interpolation="bilinear")
            ax.set_title(words[k - 1], fontsize=10)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png")
    return path


def write_index(figures_dir: str, entries: Sequence[Mapping]) -> str:
    """Writes `figures_dir/index.html` listing the figures with captions and references.

    Args:
      figures_dir: the folder holding the PNGs (created if missing).
      entries: dicts with `image_id`, `png` (path, written relative to
        `figures_dir` when inside it), `caption`, `references` (list of str)
        and optionally `metrics` (name -> value).
    Returns:
      The path of index.html. All text is HTML-escaped.
    """
    os.makedirs(figures_dir, exist_ok=True)
    esc = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    parts = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">",
             "<title>Attention figures</title>",
             "<style>body{font-family:sans-serif;margin:2em}"
             ".entry{margin-bottom:2.5em;border-bottom:1px solid #ccc;padding-bottom:1em}"
             "img{max-width:100%}.caption{font-size:1.2em;font-weight:bold}"
             "table{border-collapse:collapse}td{padding:0 1em 0 0}</style>",
             "</head><body>", "<h1>Attention figures</h1>"]
    for entry in entries:
        png = str(entry.get("png", ""))
        rel = os.path.relpath(png, figures_dir) if os.path.isabs(png) else png
        parts.append("<div class=\"entry\">")
        parts.append(f"<h2>{esc(entry.get('image_id', ''))}</h2>")
        if png:
            parts.append(f"<img src=\"{esc(rel)}\" alt=\"{esc(entry.get('caption', ''))}\">")
        parts.append(f"<p class=\"caption\">{esc(entry.get('caption', ''))}</p>")
        refs = entry.get("references") or []
        if refs:
            parts.append("<p>References:</p><ol>")
            parts += [f"<li>{esc(r)}</li>" for r in refs]
            parts.append("</ol>")
        metrics = entry.get("metrics") or {}
        if metrics:
            parts.append("<table>")
            for name, value in metrics.items():
                shown = f"{value:.4f}" if isinstance(value, float) else value
                parts.append(f"<tr><td>{esc(name)}</td><td>{esc(shown)}</td></tr>")
            parts.append("</table>")
        parts.append("</div>")
    parts.append("</body></html>")
    path = os.path.join(figures_dir, "index.html")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")
    os.replace(tmp, path)
    return path
