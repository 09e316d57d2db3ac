"""Images that are small on the wire and costly to decode (decode-work tests, benchmarks).

- `repeated_scan_jpeg`: a progressive JPEG whose last scan is repeated: a
  uniform image's scan is a few bytes, and the decoder walks every block of
  the image once per scan.
- `interlaced_png`: an Adam7 PNG (PIL writes none), built with zlib.
- `many_frame_gif`: a GIF of many frames (PIL's own encoder); `tiny_frame_gif`
  one of many 1x1 frames, 15 bytes each.
"""
from __future__ import annotations

import io
import struct
import zlib
from typing import Sequence, Tuple

import numpy as np

# Adam7: (x start, y start, x step, y step) of the seven passes.
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
          (1, 0, 2, 2), (0, 1, 1, 2))


def jpeg(size: Tuple[int, int], color=(128, 128, 128), noise: float = 0.0, **save) -> bytes:
    """A JPEG written by PIL (`save`: PIL's JPEG options, e.g. progressive=True).

    Args:
      size: (width, height).
      color: the base colour.
      noise: standard deviation of Gaussian noise added to a smooth gradient
        (0: a uniform image), for photo-like entropy-coded data.
      **save: passed to `Image.save`.
    Returns:
      The encoded bytes.
    """
    from PIL import Image
    width, height = size
    if noise:  # float32 throughout: a 40 Mpx image stays under 1 GB
        rng = np.random.default_rng(0)
        pixels = rng.standard_normal((height, width, 3), dtype=np.float32) * noise
        pixels[..., 0] += np.linspace(0, 255, width, dtype=np.float32)[None, :]
        pixels[..., 1] += np.linspace(0, 255, height, dtype=np.float32)[:, None]
        pixels[..., 2] += color[2]
        image = Image.fromarray(np.clip(pixels, 0, 255, out=pixels).astype(np.uint8))
    else:
        image = Image.new("RGB", size, color)
    out = io.BytesIO()
    image.save(out, format="JPEG", **save)
    return out.getvalue()


def repeated_scan_jpeg(side: int, repeats: int, color=(128, 128, 128)) -> bytes:
    """A progressive side x side JPEG whose last scan appears `repeats` more times.

    The segment from the last SOS marker to just before EOI is copied
    `repeats` times before EOI: libjpeg-turbo warns about the bogus
    progression and decodes every copy.
    """
    data = jpeg((side, side), color, progressive=True)
    last = data.rfind(b"\xff\xda")
    eoi = data.rfind(b"\xff\xd9")
    return data[:eoi] + data[last:eoi] * repeats + data[eoi:]


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return (struct.pack(">I", len(payload)) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF))


def interlaced_png(pixels: np.ndarray) -> bytes:
    """An Adam7-interlaced 8-bit RGB PNG of `pixels` ((H, W, 3) uint8)."""
    height, width = pixels.shape[:2]
    raw = bytearray()
    for x0, y0, dx, dy in _ADAM7:
        sub = pixels[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        for row in sub:  # filter type 0 per row
            raw += b"\x00" + row.tobytes()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 1)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(bytes(raw), 6)) + _chunk(b"IEND", b""))


def many_frame_gif(size: Tuple[int, int], frames: int) -> bytes:
    """A GIF of `frames` frames of `size` (width, height), alternating two colours."""
    from PIL import Image
    images = [Image.new("P", size, i % 2) for i in range(frames)]
    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:],
                   optimize=False, disposal=0)
    return out.getvalue()


def tiny_frame_gif(frames: int) -> bytes:
    """A 1x1 GIF of `frames` frames of 15 bytes each (built by hand: PIL takes seconds)."""
    header = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    # Image descriptor at (0, 0), 1x1, no local table; LZW minimum code size 2;
    # one sub-block with the codes clear (4), pixel 0, end (5) in 3 bits each.
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return header + frame * frames + b"\x3b"


def animated_webp(size: Tuple[int, int], frames: int) -> bytes:
    """An animated WebP (VP8X with ANMF chunks) of `frames` frames of `size`."""
    from PIL import Image
    images = [Image.new("RGB", size, (i * 40 % 256, 0, 0)) for i in range(frames)]
    out = io.BytesIO()
    images[0].save(out, format="WEBP", save_all=True, append_images=images[1:], duration=50)
    return out.getvalue()


def scans_of(data: bytes) -> Sequence[int]:
    """Offsets of the SOS markers a naive byte search finds (tests compare with the parser)."""
    return [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xDA]
