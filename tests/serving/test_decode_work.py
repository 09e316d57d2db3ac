"""Decode work from the bytes: JPEG scans, PNG interlacing, GIF and WebP frames, the limit."""
from __future__ import annotations

import io
import struct
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from serving.limits.decode_work import MIN_PASS_WORK, DecodeWorkError, check_work, estimate
from serving.limits.image_headers import ImageHeaderError, probe_image
from serving.server.flags import DEFAULTS
from tests.serving.fixtures import solid_image
from tests.serving.hostile_images import (
    animated_webp,
    interlaced_png,
    jpeg,
    many_frame_gif,
    repeated_scan_jpeg,
    scans_of,
    tiny_frame_gif,
)
from tests.tools import require_tool


def _estimate(data: bytes, stop_above: int = 0):
    return estimate(data, probe_image(data), stop_above)


def _with_size(data: bytes, width: int, height: int) -> bytes:
    """A JPEG whose frame header claims width x height (its scans stay as they were)."""
    for marker in (b"\xff\xc0", b"\xff\xc1", b"\xff\xc2"):
        at = data.find(marker)
        if at >= 0:
            return data[:at + 5] + struct.pack(">HH", height, width) + data[at + 9:]
    raise AssertionError("no frame header")


def _scan_count(data: bytes) -> int:
    what = _estimate(data).what
    return int(what.split(" with ")[1].split()[0])


@pytest.mark.parametrize("save,scans,passes", [
    (dict(), 1, 1.5),  # baseline 4:2:0: Y + Cb/4 + Cr/4
    (dict(subsampling=0), 1, 3.0),
    (dict(optimize=True), 1, 1.5),
    (dict(progressive=True), 10, 8.0),  # libjpeg's script
    (dict(progressive=True, optimize=True), 10, 8.0),
    (dict(progressive=True, subsampling=0), 10, 14.0),
])
def test_pil_jpegs_count_every_scan_and_component(save, scans, passes):
    data = jpeg((1024, 768), noise=12, **save)  # whole MCUs: no rounding
    cost = _estimate(data)
    assert _scan_count(data) == scans == len(scans_of(data))
    assert cost.pixels == 1024 * 768 and cost.passes == pytest.approx(passes)
    assert cost.complete and ("progressive" in cost.what) == bool(save.get("progressive"))


def test_grayscale_and_cmyk_progressive():
    gray, cmyk = io.BytesIO(), io.BytesIO()
    Image.new("L", (512, 256), 90).save(gray, "JPEG", progressive=True)
    Image.new("CMYK", (512, 256), (1, 2, 3, 4)).save(cmyk, "JPEG", progressive=True)
    assert (_scan_count(gray.getvalue()), _estimate(gray.getvalue()).passes) == (6, 6.0)
    # 2 + 4 x 4 scans; the two DC scans cover all four full-size components.
    assert (_scan_count(cmyk.getvalue()), _estimate(cmyk.getvalue()).passes) == (18, 24.0)


def test_entropy_data_is_skipped_with_stuffing_and_restart_markers():
    data = jpeg((640, 480), noise=40, progressive=True, restart_marker_blocks=1)
    assert data.count(b"\xff\x00") > 100  # stuffed 0xFF bytes in the scans
    assert sum(data.count(bytes([0xFF, m])) for m in range(0xD0, 0xD8)) > 1000
    assert _scan_count(data) == 10


def test_markers_inside_segments_and_after_eoi_do_not_count():
    data = jpeg((64, 64), noise=5, comment=b"\xff\xda\xff\xd9 not a scan")
    assert len(scans_of(data)) == 2 and _scan_count(data) == 1
    # An EXIF-like APP1 segment holding a whole progressive JPEG (a thumbnail).
    thumb = jpeg((32, 32), progressive=True)
    app1 = b"\xff\xe1" + struct.pack(">H", len(thumb) + 8) + b"Exif\x00\x00" + thumb
    base = jpeg((64, 64))
    assert _scan_count(base[:2] + app1 + base[2:]) == 1
    # The decoder stops at EOI: scans appended after it are never decoded.
    last = base.rfind(b"\xff\xda")
    assert _scan_count(base + base[last:] * 50) == 1


def test_repeated_scans_multiply_the_work():
    base = _estimate(repeated_scan_jpeg(2000, 0))
    hostile = repeated_scan_jpeg(2000, 4000)
    cost = _estimate(hostile)
    assert len(hostile) < 100_000
    assert _scan_count(hostile) == 4010
    # The repeated scan is the luma refinement: one full pass per copy.
    assert cost.work == base.work + 4000 * 2000 * 2000
    with pytest.raises(DecodeWorkError, match="progressive JPEG of 2000x2000 with 4010 scans.*"
                                              "exceeds --max-decode-work 2000000000"):
        check_work(hostile, probe_image(hostile), DEFAULTS.max_decode_work)


def test_the_walk_stops_at_the_limit_and_still_names_every_scan():
    hostile = repeated_scan_jpeg(2000, 4000)
    cost = _estimate(hostile, stop_above=100_000_000)
    assert not cost.complete and 100_000_000 < cost.work <= 104_000_000
    assert cost.what.endswith("with 4010 scans") and cost.counted_to == "scan 28"
    with pytest.raises(DecodeWorkError) as e:
        check_work(hostile, probe_image(hostile), 100_000_000)
    assert "already 104000000" in str(e.value) and "by scan 28" in str(e.value)


def test_every_scan_and_frame_costs_at_least_the_floor():
    tiny = repeated_scan_jpeg(8, 100)
    assert _estimate(tiny).work == 110 * MIN_PASS_WORK
    assert _estimate(solid_image((1, 2, 3), size=1)).work == MIN_PASS_WORK


def test_a_truncated_or_scanless_jpeg_counts_one_pass():
    data = jpeg((256, 256), noise=10)
    truncated = data[:data.find(b"\xff\xda") + 40]
    assert _estimate(truncated).work == 256 * 256 * 1.5  # the scan it starts
    no_scan = data[:data.find(b"\xff\xda")] + b"\xff\xd9"
    assert _estimate(no_scan).work == 256 * 256


def test_png_interlacing_is_seven_passes():
    pixels = np.zeros((300, 400, 3), np.uint8)
    plain = io.BytesIO()
    Image.fromarray(pixels).save(plain, "PNG")
    assert _estimate(plain.getvalue()).work == 120_000
    interlaced = _estimate(interlaced_png(pixels))
    assert interlaced.work == 7 * 120_000 and "Adam7" in interlaced.what


def test_gif_and_webp_frames():
    gif = _estimate(many_frame_gif((400, 300), 25))
    assert gif.work == 25 * 120_000 and "25 frames" in gif.what
    webp = _estimate(animated_webp((400, 300), 4))
    assert webp.work == 4 * 120_000 and "4 frames" in webp.what
    many = tiny_frame_gif(DEFAULTS.max_decode_work // MIN_PASS_WORK + 1)
    with pytest.raises(DecodeWorkError, match="GIF of 1x1 with 30518 frames"):
        check_work(many, probe_image(many), DEFAULTS.max_decode_work)


def test_frame_walks_stop_at_max_frames():
    from serving.limits.image_headers import MAX_FRAMES
    assert MAX_FRAMES * MIN_PASS_WORK > DEFAULTS.max_decode_work  # refused anyway by default
    with pytest.raises(ImageHeaderError, match=f"GIF with more than {MAX_FRAMES} frames"):
        probe_image(tiny_frame_gif(1_000_000))  # 15 MB
    assert probe_image(tiny_frame_gif(MAX_FRAMES)).frames == MAX_FRAMES


@pytest.mark.parametrize("save,passes", [
    (dict(), 1.5), (dict(subsampling=0), 3.0), (dict(progressive=True), 8.0),
    (dict(progressive=True, subsampling=0), 14.0)])
def test_the_largest_allowed_image_passes_the_default_limit(save, passes):
    # Camera-like sizes at the pixel limit (8000x5000 = 40 M): the header is
    # patched, the scan structure is what PIL writes.
    width, height = 8000, DEFAULTS.max_image_pixels // 8000
    data = _with_size(jpeg((64, 64), noise=10, **save), width, height)
    assert probe_image(data).pixels == DEFAULTS.max_image_pixels
    assert check_work(data, probe_image(data), DEFAULTS.max_decode_work) == \
        pytest.approx(passes * DEFAULTS.max_image_pixels, rel=0.01)


def test_worst_common_encodings_at_the_pixel_limit_pass():
    cmyk = io.BytesIO()
    Image.new("CMYK", (64, 64), (1, 2, 3, 4)).save(cmyk, "JPEG", progressive=True)
    data = _with_size(cmyk.getvalue(), 8000, 5000)  # 24 passes: 0.96 G
    assert check_work(data, probe_image(data), DEFAULTS.max_decode_work) == 960_000_000
    png = bytearray(interlaced_png(np.zeros((8, 8, 3), np.uint8)))
    png[16:24] = struct.pack(">II", 8000, 5000)
    assert check_work(bytes(png), probe_image(bytes(png)), DEFAULTS.max_decode_work) == \
        7 * 40_000_000
    # The largest request the pixel limits allow fits the default budget.
    assert 2 * 960_000_000 <= 2 * DEFAULTS.max_decode_work


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP", "WEBP"])
def test_fixture_images_pass(fmt):
    data = solid_image((200, 40, 40), size=640, fmt=fmt)
    assert 0 < check_work(data, probe_image(data), DEFAULTS.max_decode_work) <= \
        3 * 640 * 640


@pytest.mark.parametrize("options,scans", [
    ([], 1), (["-progressive"], 10), (["-progressive", "-optimize"], 10),
    (["-progressive", "-grayscale"], 6), (["-progressive", "-sample", "1x1"], 10)])
def test_cjpeg_writes_what_is_counted(tmp_path, options, scans):
    cjpeg = require_tool("cjpeg", "libjpeg-turbo's own progressive scan scripts")
    ppm = tmp_path / "in.ppm"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(ppm)
    data = subprocess.run([cjpeg, *options, str(ppm)], check=True,
                          capture_output=True).stdout
    assert _scan_count(data) == scans == len(scans_of(data))
    assert check_work(data, probe_image(data), DEFAULTS.max_decode_work) <= 14 * 320 * 240


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 4000))
def test_arbitrary_bytes_after_a_valid_header_never_crash(tail, cut):
    head = jpeg((48, 32), noise=5, progressive=True)
    data = head[:cut] + tail
    try:
        info = probe_image(data)
    except ImageHeaderError:
        return
    if info is not None:
        try:
            assert check_work(data, info, 10 ** 9) >= 0
        except ImageHeaderError:
            pass

