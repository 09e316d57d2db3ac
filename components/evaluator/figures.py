"""The Evaluator's attention figures and their HTML index.

The drawing itself lives in `serving.client.attention_figure` (the gRPC client draws
the same figures); this module adds the index page.
"""
from __future__ import annotations

import html
import os
from typing import Mapping, Sequence

from serving.client.attention_figure import attention_figure, upsample_attention  # noqa: F401


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
