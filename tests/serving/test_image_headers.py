"""Image sizes read from headers agree with decoders; bombs are caught from the header."""
from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image

from serving.limits.image_headers import ImageHeaderError, check_pixels, probe_image


def encode(size, fmt, mode="RGB", **kwargs) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, 128).save(out, format=fmt, **kwargs)
    return out.getvalue()


@pytest.mark.parametrize("fmt, name", [("PNG", "PNG"), ("JPEG", "JPEG"), ("GIF", "GIF"),
                                       ("BMP", "BMP"), ("WEBP", "WebP")])
@pytest.mark.parametrize("size", [(1, 1), (37, 5), (300, 1200)])
def test_size_matches_the_encoder(fmt, name, size):
    info = probe_image(encode(size, fmt))
    assert (info.format, info.width, info.height, info.frames) == (name, *size, 1)


def test_progressive_jpeg_and_lossless_webp():
    assert probe_image(encode((64, 48), "JPEG", progressive=True)).width == 64
    info = probe_image(encode((70, 30), "WEBP", lossless=True))
    assert (info.width, info.height) == (70, 30)


def test_animations_count_every_frame():
    frames = [Image.new("RGB", (20, 10), (i * 40, 0, 0)) for i in range(5)]
    for fmt in ("GIF", "WEBP"):
        out = io.BytesIO()
        frames[0].save(out, format=fmt, save_all=True, append_images=frames[1:], duration=50)
        info = probe_image(out.getvalue())
        assert (info.width, info.height, info.frames) == (20, 10, 5), fmt
        assert info.pixels == 1000


def test_unknown_bytes_are_not_images():
    for data in (b"", b"hello", b"BMW cars are fast, they say", b"RIFF....WAVEfmt "):
        assert probe_image(data) is None
        assert check_pixels(data, 10) is None


def png_claiming(width, height) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr
            + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)))


def test_bomb_rejected_from_header_alone():
    with pytest.raises(ImageHeaderError, match="exceeds the limit of 40000000 pixels"):
        check_pixels(png_claiming(100_000, 100_000), 40_000_000)
    assert check_pixels(png_claiming(4000, 4000), 40_000_000).pixels == 16_000_000
    assert check_pixels(png_claiming(100_000, 100_000), 0) is not None  # 0 = no limit


def test_broken_headers_are_errors():
    jpeg = encode((10, 10), "JPEG")
    for data in (b"\x89PNG\r\n\x1a\n\x00\x00", jpeg[:4], b"\xff\xd8\xff\xd9",
                 b"RIFF\x00\x00\x00\x00WEBPVP8X", b"GIF89a\x01"):
        with pytest.raises(ImageHeaderError):
            probe_image(data)
    with pytest.raises(ImageHeaderError, match="empty size"):
        check_pixels(png_claiming(0, 10), 100)


def test_jpeg_xl_codestream_sizes():
    # Small header: height (h+1)*8 in 5 bits, ratio 0, width (w+1)*8 in 5 bits.
    bits = [1] + [1, 0, 0, 0, 0] + [0, 0, 0] + [0, 1, 0, 0, 0]  # 16 x 24
    value = sum(b << i for i, b in enumerate(bits))
    data = b"\xff\x0a" + value.to_bytes(3, "little")
    info = probe_image(data)
    assert (info.format, info.width, info.height) == ("JPEG XL", 24, 16)


def test_gif_frame_larger_than_the_screen_counts():
    out = io.BytesIO()
    Image.new("P", (300, 200), 1).save(out, format="GIF")
    data = bytearray(out.getvalue())
    data[6:10] = struct.pack("<HH", 1, 1)  # the header now claims 1x1
    info = probe_image(bytes(data))
    assert (info.width, info.height, info.largest_frame, info.pixels) == (1, 1, 60_000, 60_000)
    with pytest.raises(ImageHeaderError, match="with a frame of 60000 pixels"):
        check_pixels(bytes(data), 59_999)
    assert check_pixels(bytes(data), 60_000).pixels == 60_000
