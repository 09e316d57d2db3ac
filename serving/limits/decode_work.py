"""Decode work of an image, estimated from its bytes before any decoding (CPU bombs).

Pixels bound an image's memory, not its CPU: the decoder may walk the
whole image many times. A progressive JPEG is decoded scan by scan, and
every scan walks every 8x8 block of the components it covers, however few
bytes the scan holds: a 2000x2000 uniform grey JPEG whose last scan is
repeated 4,000 times is 72 KB and costs libjpeg-turbo tens of seconds.

**Decode work** is the number of pixel-passes the decoder makes, counted
from the file's structure:

- JPEG: the sum over its scans (SOS markers before EOI) of the samples of
  the components each scan covers, in whole MCUs. A component sampled at
  h x v of the largest factors counts h*v/(hmax*vmax) of the image's
  pixels, so a 4:2:0 colour scan of all three components counts 1.5 passes,
  a luma-only scan 1, a chroma-only scan 0.25. A baseline 4:2:0 JPEG is 1.5
  passes; libjpeg's progressive script is 10 scans, 8 passes (4:2:0) or 14
  (4:4:4); a progressive CMYK JPEG 18 scans, 24 passes.
- PNG: one pass, seven for Adam7 interlacing (libpng reads each row once
  per pass it appears in; measured 1.6x the decode time of the same image
  not interlaced: 7 is an upper bound).
- GIF and animated WebP: one pass per frame, each over the larger of the
  screen and the largest frame (the decoder fills a screen-sized buffer per
  frame), as `ImageInfo.pixels` counts them.
- BMP, JPEG XL, a still WebP: one pass.

Every pass counts at least `MIN_PASS_WORK` pixels (a 256x256 image): a
scan or frame has a fixed cost even on a 1x1 image.

The figures are upper bounds of what libjpeg-turbo, libpng, giflib and
libwebp walk, not times: measured on a 2-core AMD EPYC (docs/PERFORMANCE.md),
one unit costs 0.6 ns (a hostile scan of empty blocks) to 6 ns (PNG).
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from serving.limits.image_headers import ImageHeaderError, ImageInfo

# A scan or frame costs the decoder a fixed amount (markers, tables,
# buffers) on any image, and costs `_jpeg` below about 1 us to walk: each
# counts at least a 256x256 pass, so a limit of L lets through at most
# L / 65,536 of them (30,517 under the default), walked in about 25 ms.
MIN_PASS_WORK = 65536
# SOFn markers (frame headers); C2, C6, CA, CE are progressive.
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_JPEG_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}
# In entropy-coded data 0xFF is followed by 0x00 (stuffing), 0xD0-0xD7 (RST)
# or 0xFF (fill): anything else ends the scan with a marker.
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


class DecodeWorkError(ImageHeaderError):
    """An image whose estimated decode work exceeds the limit."""


@dataclass(frozen=True)
class DecodeWork:
    """What decoding one image will cost.

    Attributes:
      work: pixel-passes (see the module doc).
      pixels: the pixels of one pass (width x height; for GIF, the larger of
        the screen and the largest frame).
      what: the image in words, naming what multiplies its work, e.g.
        "progressive JPEG of 2000x2000 with 4001 scans".
      complete: False when the walk stopped early, past `stop_above`: the
        image needs at least `work`.
      counted_to: where an incomplete walk stopped, e.g. "scan 503".
    """
    work: int
    pixels: int
    what: str
    complete: bool = True
    counted_to: str = ""

    @property
    def passes(self) -> float:
        """Work in passes over the image's pixels."""
        return self.work / max(self.pixels, 1)


def estimate(data: bytes, info: ImageInfo, stop_above: int = 0) -> DecodeWork:
    """Estimates the decode work of an image whose header `probe_image` read.

    Args:
      data: the encoded image.
      info: `probe_image(data)`.
      stop_above: when > 0, a JPEG's walk stops as soon as its work exceeds
        this (the answer is then a lower bound, `complete=False`): a refusal
        needs no more, and the walk's own time stays bounded.
    Returns:
      The estimate.
    Raises:
      ImageHeaderError: a JPEG whose structure is broken before its first scan.
    """
    size = f"{info.width}x{info.height}"
    pixels = info.width * info.height
    if info.format == "JPEG":
        return _jpeg(data, info, stop_above)
    if info.format == "PNG":
        interlaced = len(data) > 28 and data[28] == 1
        passes = 7 if interlaced else 1
        kind = "interlaced (Adam7) PNG" if interlaced else "PNG"
        return DecodeWork(passes * max(pixels, MIN_PASS_WORK), pixels, f"{kind} of {size}")
    if info.frames > 1:  # GIF, animated WebP
        frame = max(pixels, info.largest_frame)
        return DecodeWork(info.frames * max(frame, MIN_PASS_WORK), frame,
                          f"{info.format} of {size} with {info.frames} frames")
    frame = max(pixels, info.largest_frame)
    return DecodeWork(max(frame, MIN_PASS_WORK), frame, f"{info.format} of {size}")


def check_work(data: bytes, info: Optional[ImageInfo], max_work: int,
               stop_above: int = 0) -> int:
    """The decode work of an image; raises when it exceeds `max_work`.

    Args:
      data: the encoded image.
      info: `probe_image(data)`; None (not an image format): work 0.
      max_work: the limit (0: none).
      stop_above: stop counting above this much work (0: at `max_work`);
        the result is then only known to exceed it.
    Returns:
      The estimated work (a lower bound when above `stop_above`).
    Raises:
      DecodeWorkError: the estimate exceeds `max_work`, with a message that
        names the cause.
    """
    if info is None:
        return 0
    limits = [x for x in (max_work, stop_above) if x > 0]
    cost = estimate(data, info, min(limits) if limits else 0)
    if max_work and cost.work > max_work:
        if cost.complete:
            raise DecodeWorkError(
                f"{cost.what}: estimated decode work {cost.work} pixel-passes "
                f"({cost.passes:.1f} passes over its {cost.pixels} pixels) exceeds "
                f"--max-decode-work {max_work}")
        raise DecodeWorkError(
            f"{cost.what}: estimated decode work exceeds --max-decode-work {max_work} "
            f"pixel-passes (already {cost.work}, {cost.passes:.1f} passes over its "
            f"{cost.pixels} pixels, by {cost.counted_to})")
    return cost.work


def _jpeg(data: bytes, info: ImageInfo, stop_above: int) -> DecodeWork:
    """Walks the markers to EOI, skipping entropy-coded data, and sums each scan's samples."""
    i, n = 2, len(data)
    components: Dict[int, Tuple[int, int]] = {}  # id -> (h, v)
    mcus = progressive = 0
    hmax = vmax = 1
    scans = work = total = 0
    complete = True
    pixels = info.width * info.height
    scan_work: Dict[bytes, int] = {}  # SOS header -> its work (repeated scans repeat it)
    while i < n:
        if data[i] != 0xFF:
            break  # junk: libjpeg stops with an error or a warning, not with more scans
        while i < n and data[i] == 0xFF:
            i += 1
        if i >= n:
            break
        marker = data[i]
        i += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            continue
        if marker == 0xD9:  # EOI: the decoder reads no further
            break
        if i + 2 > n:
            break
        length = (data[i] << 8) | data[i + 1]
        if length < 2:
            raise ImageHeaderError("JPEG segment with invalid length")
        segment = data[i + 2:i + length]
        i += length
        if marker in _JPEG_SOF and not components:
            progressive = marker in _JPEG_PROGRESSIVE
            if len(segment) < 6:
                raise ImageHeaderError("truncated JPEG frame header")
            height, width, count = struct.unpack(">HHB", segment[1:6])
            for k in range(count):
                entry = segment[6 + 3 * k:9 + 3 * k]
                if len(entry) < 3:
                    raise ImageHeaderError("truncated JPEG frame header")
                components[entry[0]] = (max(entry[1] >> 4, 1), max(entry[1] & 0x0F, 1))
            hmax = max(h for h, _ in components.values())
            vmax = max(v for _, v in components.values())
            # MCUs in an interleaved scan; a non-interleaved one has as many or fewer blocks.
            mcus = -(-max(width, 1) // (8 * hmax)) * -(-max(height, 1) // (8 * vmax))
        elif marker == 0xDA:
            if not components:
                raise ImageHeaderError("JPEG has no frame header before its scan data")
            scans += 1
            this = scan_work.get(segment)
            if this is None:
                ids = segment[1:1 + 2 * segment[0]:2] if segment else b""
                samples = 0
                for cid in ids:
                    # An unknown id is an error in libjpeg: count the largest component.
                    h, v = components.get(cid, (hmax, vmax))
                    samples += mcus * h * v * 64
                this = scan_work[segment] = max(samples, MIN_PASS_WORK)
            work += this
            if stop_above and work > stop_above:
                complete = False
                # Entropy-coded data holds no 0xFFDA (0xFF is stuffed): the rest
                # of the markers, counted at C speed, are the scans not walked.
                total = scans + data.count(b"\xff\xda", i)
                break
            match = _NEXT_MARKER.search(data, i)
            if match is None:
                break  # truncated scan: the decoder stops here too
            i = match.start()
    if not scans:  # no scan before the end: the decoder fails; count one pass
        work = max(pixels, MIN_PASS_WORK)
    kind = "progressive JPEG" if progressive else "JPEG"
    total = total or scans
    count = f"{total} scan" if total == 1 else f"{total} scans"
    return DecodeWork(work, pixels, f"{kind} of {info.width}x{info.height} with {count}",
                      complete, "" if complete else f"scan {scans}")
