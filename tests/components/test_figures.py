"""Attention figures and the HTML index."""
import numpy as np
from PIL import Image

from components.figures import attention_figure, upsample_attention, write_index


def test_attention_figure_writes_a_nontrivial_png(tmp_path):
    image = np.zeros((16, 16, 3), np.uint8)
    image[2:6, 2:6] = (230, 30, 30)
    attention = np.full((4, 3, 3), 1 / 9, np.float32)
    attention[1] = 0.0
    attention[1, 0, 0] = 1.0
    path = attention_figure(image, ["a", "red", "square"], attention,
                            str(tmp_path / "sub" / "fig.png"), title="x: a red square")
    with Image.open(path) as png:
        assert png.format == "PNG"
        w, h = png.size
        pixels = np.asarray(png.convert("RGB"))
    assert w >= 3 * 100 and h >= 100  # four panels in a row
    assert pixels.std() > 10  # not blank


def test_upsampled_map_peaks_where_attention_does():
    m = np.zeros((3, 3), np.float32)
    m[0, 2] = 1.0
    up = upsample_attention(m, 12, 12)
    assert up.shape == (12, 12) and up.max() == 1.0
    r, c = np.unravel_index(np.argmax(up), up.shape)
    assert r < 4 and c >= 8


def test_write_index_lists_escaped_captions(tmp_path):
    png = tmp_path / "a.png"
    png.write_bytes(b"")
    path = write_index(str(tmp_path), [
        {"image_id": "shapes-000001", "png": str(png), "caption": "a red <circle> & co",
         "references": ["a red circle", "there is a red circle"], "metrics": {"Bleu_4": 0.5}},
        {"image_id": "shapes-000002", "png": "b.png", "caption": "a blue square",
         "references": []},
    ])
    text = open(path, encoding="utf-8").read()
    assert path == str(tmp_path / "index.html")
    assert "a red &lt;circle&gt; &amp; co" in text and "<circle>" not in text
    assert "there is a red circle" in text and "a blue square" in text
    assert 'src="a.png"' in text and 'src="b.png"' in text
    assert "Bleu_4" in text and "0.5000" in text
