"""Attention figures and the HTML index."""
import numpy as np
import pytest
from PIL import Image

from components.evaluator.figures import attention_figure, upsample_attention, write_index
from serving.client.attention_figure import (
    MAX_DRAWN_PIXELS,
    render_attention_figure,
    save_attention_figure,
)


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


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("words", [8, 11, 17])  # two, two and three rows of six panels
def test_word_titles_never_cover_the_row_above(words):
    words = [f"word{i}" for i in range(words)]
    attention = np.random.default_rng(0).random((len(words), 3, 3)).astype(np.float32)
    fig = render_attention_figure(np.zeros((64, 64, 3), np.uint8), words, attention)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_images()]
    assert len(axes) == len(words) + 1
    titles = [ax.title.get_window_extent(renderer) for ax in axes[1:]]
    images = [ax.get_window_extent(renderer) for ax in axes]
    for t, title in enumerate(titles):
        for k, image in enumerate(images):
            assert not _boxes_overlap(title, image), (words[t], k)
    caption = fig._suptitle.get_window_extent(renderer)
    assert not any(_boxes_overlap(caption, box) for box in titles + images)


def test_the_image_panel_is_untitled_and_the_caption_is_the_default_title():
    words = ["image", "of", "a", "red", "square"]   # "image" is also a vocabulary word
    fig = render_attention_figure(np.zeros((16, 16), np.uint8), words,
                                  np.full((5, 3, 3), 1 / 9, np.float32))
    shown = [ax for ax in fig.axes if ax.get_images()]
    assert shown[0].get_title() == ""
    assert [ax.get_title() for ax in shown[1:]] == words
    assert fig._suptitle.get_text() == "image of a red square"


def test_a_large_image_is_drawn_at_panel_size(tmp_path):
    import io
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 255, (3000, 4000, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(photo).save(buf, format="JPEG")
    attention = np.full((3, 3, 3), 1 / 9, np.float32)
    fig = render_attention_figure(photo, ["a", "big", "photo"], attention)
    for ax in fig.axes:
        for drawn in ax.get_images():
            assert max(drawn.get_array().shape[:2]) <= MAX_DRAWN_PIXELS
            assert drawn.get_array().shape[:2] == (MAX_DRAWN_PIXELS * 3 // 4, MAX_DRAWN_PIXELS)
    path = save_attention_figure(buf.getvalue(), ["a", "big", "photo"], attention,
                                 str(tmp_path / "big.png"))
    with Image.open(path) as png:
        assert png.size[0] <= 4 * 160 + 10      # four panels, not a 4000-pixel canvas
