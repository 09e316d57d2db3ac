"""Image sizes from file headers, read before any decoding (decompression bombs).

A 40 KB PNG can claim 100000 x 100000 pixels; decoding it would allocate
30 GB. The server reads the width, height (and, for GIF and WebP
animations, the frame count: `tf.io.decode_image` decodes every frame even
with `expand_animations=False`; for GIF also every frame's own rectangle,
which may be larger than the logical screen the header states) in pure
Python and rejects the image before TensorFlow sees it.

Formats are those `tf.io.decode_image` accepts: PNG, JPEG, GIF, BMP, WebP
and JPEG XL. Bytes that match none of their signatures are not an image to
this module (`probe_image` returns None) and are left to the model, whose
decoder rejects them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Optional


class ImageHeaderError(ValueError):
    """A recognised image format whose header is truncated or invalid."""


@dataclass(frozen=True)
class ImageInfo:
    """What the header says: format, size, number of frames, largest frame.

    `largest_frame` is the area of the largest frame rectangle (GIF image
    descriptors): a frame may be larger than the logical screen the header
    states, and the decoder allocates for the frame.
    """
    format: str
    width: int
    height: int
    frames: int = 1
    largest_frame: int = 0

    @property
    def pixels(self) -> int:
        """Pixels the decoder will allocate: every frame, each at least the screen size."""
        return max(self.width * self.height, self.largest_frame) * max(self.frames, 1)


_PNG = b"\x89PNG\r\n\x1a\n"
_JXL_CONTAINER = b"\x00\x00\x00\x0cJXL \r\n\x87\n"
# SOFn markers carry the frame size; C4 (DHT), C8 (JPG), CC (DAC) do not.
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_BMP_DIB_SIZES = {12, 16, 40, 52, 56, 64, 108, 124}
# Frames counted at most. The walk costs about 1 us a frame in Python and a
# 16 MB GIF holds a million 1x1 frames; more are refused (the default
# --max-decode-work, at least 65,536 a frame, refuses over 30,517 anyway).
MAX_FRAMES = 32768


def probe_image(data: bytes) -> Optional[ImageInfo]:
    """Reads an image's size from its header.

    Args:
      data: encoded image bytes.
    Returns:
      An `ImageInfo`, or None when the bytes start like none of the formats.
    Raises:
      ImageHeaderError: the format is recognised but its header is broken.
    """
    if data.startswith(_PNG):
        return _png(data)
    if data.startswith(b"\xff\xd8\xff"):
        return _jpeg(data)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    if data.startswith(b"\xff\x0a") or data.startswith(_JXL_CONTAINER):
        return _jxl(data)
    if data[:2] == b"BM":
        return _bmp(data)
    return None


def check_pixels(data: bytes, max_pixels: int) -> Optional[ImageInfo]:
    """Probes `data` and raises when it would decode to more than `max_pixels`.

    Raises:
      ImageHeaderError: broken header, empty size, or too many pixels.
    """
    info = probe_image(data)
    if info is None:
        return None
    if info.width <= 0 or info.height <= 0:
        raise ImageHeaderError(f"{info.format} header gives an empty size "
                               f"{info.width}x{info.height}")
    if max_pixels and info.pixels > max_pixels:
        frames = f" x {info.frames} frames" if info.frames > 1 else ""
        if info.largest_frame > info.width * info.height:
            frames = f" with a frame of {info.largest_frame} pixels{frames}"
        raise ImageHeaderError(
            f"{info.format} image of {info.width}x{info.height}{frames} = {info.pixels} "
            f"pixels exceeds the limit of {max_pixels} pixels")
    return info


def _need(data: bytes, end: int, fmt: str) -> None:
    if len(data) < end:
        raise ImageHeaderError(f"truncated {fmt} header ({len(data)} bytes)")


def _png(data: bytes) -> ImageInfo:
    _need(data, 24, "PNG")
    length, kind = struct.unpack(">I4s", data[8:16])
    if kind != b"IHDR" or length != 13:
        raise ImageHeaderError("PNG does not start with an IHDR chunk")
    width, height = struct.unpack(">II", data[16:24])
    return ImageInfo("PNG", width, height)


def _jpeg(data: bytes) -> ImageInfo:
    i, n = 2, len(data)
    while i < n:
        if data[i] != 0xFF:
            raise ImageHeaderError(f"JPEG marker expected at byte {i}")
        while i < n and data[i] == 0xFF:  # fill bytes
            i += 1
        if i >= n:
            break
        marker = data[i]
        i += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # standalone markers
            continue
        if marker in (0xD9, 0xDA):
            raise ImageHeaderError("JPEG has no frame header before its scan data")
        _need(data, i + 2, "JPEG")
        (length,) = struct.unpack(">H", data[i:i + 2])
        if length < 2:
            raise ImageHeaderError("JPEG segment with invalid length")
        if marker in _JPEG_SOF:
            _need(data, i + 7, "JPEG")
            height, width = struct.unpack(">HH", data[i + 3:i + 7])
            return ImageInfo("JPEG", width, height)
        i += length
    raise ImageHeaderError("truncated JPEG: no frame header")


def _gif(data: bytes) -> ImageInfo:
    _need(data, 13, "GIF")
    width, height, packed = struct.unpack("<HHB", data[6:11])
    i = 13
    if packed & 0x80:
        i += 3 * (1 << ((packed & 0x07) + 1))
    frames, largest, n = 0, 0, len(data)
    # Walk the blocks to count frames; stop quietly at truncation or junk
    # (the decoder rejects those), so a short count only under-estimates
    # frames that TensorFlow could not decode anyway.
    while i < n:
        block = data[i]
        if block == 0x3B:  # trailer
            break
        if block == 0x2C:  # image descriptor
            if i + 10 > n:
                break
            frames += 1
            if frames > MAX_FRAMES:
                raise ImageHeaderError(f"GIF with more than {MAX_FRAMES} frames, the most "
                                       f"this server reads")
            # left, top, width, height: the decoder allocates the frame's own
            # rectangle, which may exceed the logical screen.
            frame_w, frame_h = struct.unpack("<HH", data[i + 5:i + 9])
            largest = max(largest, frame_w * frame_h)
            flags = data[i + 9]
            i += 10
            if flags & 0x80:
                i += 3 * (1 << ((flags & 0x07) + 1))
            i += 1  # LZW minimum code size
        elif block == 0x21:  # extension: label, then sub-blocks
            i += 2
        else:
            break
        while i < n:  # sub-blocks until a zero length
            size = data[i]
            i += 1 + size
            if size == 0:
                break
    return ImageInfo("GIF", width, height, max(frames, 1), largest)


def _bmp(data: bytes) -> Optional[ImageInfo]:
    if len(data) < 26:
        return None
    (dib_size,) = struct.unpack("<I", data[14:18])
    if dib_size not in _BMP_DIB_SIZES:
        return None  # "BM" but not a bitmap header: leave it to the model
    if dib_size == 12:
        width, height = struct.unpack("<HH", data[18:22])
    else:
        width, height = struct.unpack("<ii", data[18:26])
    return ImageInfo("BMP", width, abs(height))


def _webp(data: bytes) -> ImageInfo:
    _need(data, 30, "WebP")
    chunk = data[12:16]
    if chunk == b"VP8 ":
        if data[23:26] != b"\x9d\x01\x2a":
            raise ImageHeaderError("WebP VP8 frame without its start code")
        width, height = struct.unpack("<HH", data[26:30])
        return ImageInfo("WebP", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L":
        if data[20] != 0x2F:
            raise ImageHeaderError("WebP VP8L without its signature byte")
        (bits,) = struct.unpack("<I", data[21:25])
        return ImageInfo("WebP", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X":
        flags = data[20]
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
        frames = 1
        if flags & 0x02:  # animation: count ANMF chunks
            frames, i, n = 0, 30, len(data)
            while i + 8 <= n:
                kind = data[i:i + 4]
                (size,) = struct.unpack("<I", data[i + 4:i + 8])
                if kind == b"ANMF":
                    frames += 1
                    if frames > MAX_FRAMES:
                        raise ImageHeaderError(f"WebP with more than {MAX_FRAMES} frames, the "
                                               f"most this server reads")
                i += 8 + size + (size & 1)
        return ImageInfo("WebP", width, height, max(frames, 1))
    raise ImageHeaderError(f"unknown WebP chunk {chunk!r}")


class _Bits:
    """LSB-first bit reader (JPEG XL headers)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, n: int) -> int:
        value = 0
        for k in range(n):
            byte = self.pos >> 3
            if byte >= len(self.data):
                raise ImageHeaderError("truncated JPEG XL header")
            value |= ((self.data[byte] >> (self.pos & 7)) & 1) << k
            self.pos += 1
        return value

    def u32(self, *bits: int) -> int:
        return self.read(bits[self.read(2)]) + 1


_JXL_RATIOS = {1: (1, 1), 2: (12, 10), 3: (4, 3), 4: (3, 2), 5: (16, 9), 6: (5, 4), 7: (2, 1)}


def _jxl(data: bytes) -> ImageInfo:
    if data.startswith(_JXL_CONTAINER):
        i, n, stream = 12, len(data), None
        while i + 8 <= n:  # ISO BMFF boxes: find the (first) codestream box
            (size,) = struct.unpack(">I", data[i:i + 4])
            kind = data[i + 4:i + 8]
            start = i + 8
            if size == 1:
                _need(data, i + 16, "JPEG XL")
                (size,) = struct.unpack(">Q", data[i + 8:i + 16])
                start = i + 16
            if kind == b"jxlc":
                stream = data[start:]
                break
            if kind == b"jxlp":
                stream = data[start + 4:]
                break
            if size == 0:
                break
            i += size
        if stream is None:
            raise ImageHeaderError("JPEG XL container without a codestream box")
        data = stream
    if not data.startswith(b"\xff\x0a"):
        raise ImageHeaderError("JPEG XL codestream without its signature")
    bits = _Bits(data[2:])
    if bits.read(1):  # small size: multiples of 8 up to 256
        height = (bits.read(5) + 1) * 8
        ratio = bits.read(3)
        width = (bits.read(5) + 1) * 8 if ratio == 0 else 0
    else:
        height = bits.u32(9, 13, 18, 30)
        ratio = bits.read(3)
        width = bits.u32(9, 13, 18, 30) if ratio == 0 else 0
    if ratio:
        num, den = _JXL_RATIOS[ratio]
        width = height * num // den
    return ImageInfo("JPEG XL", width, height)
