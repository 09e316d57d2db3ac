"""Fuzzing the server (a child process) over gRPC and REST with malformed requests.

Hypothesis (derandomized, no database, no shrinking: a fixed, repeatable
budget) draws categorized requests, each with the exact status it must get
(and, where stable, the message). After every BATCH requests the process must
still be alive and a valid request must get the right caption, and after each
run the server log must hold no unhandled exception. A server of its own takes
a few requests of every category, then must stop cleanly on SIGTERM.

gRPC categories (>= 1000 requests): random bytes as an image, random bytes
behind an image signature, truncated PNG/JPEG/GIF/BMP/WebP files, headers
claiming extreme sizes and real decompression bombs, valid images of extreme
sizes within the pixel limit (these must work), wrong dtypes (every DataType
and unknown enum values), wrong ranks and shapes, empty batches, unparsable
tensors and padding bombs (a few bytes claiming a huge shape), unknown models
(path-like names included), versions, labels, signatures and inputs, bad
output filters, metadata/status faults, raw non-protobuf bytes, and messages
over --max-request-bytes.

REST categories (>= 300 requests): malformed JSON and random bodies, bad
base64, wrong JSON types and shapes, bodies over the limit (413) and bad
Content-Length/chunked bodies, unknown models/versions/labels and
path traversal in the URL, unknown paths, and broken HTTP request lines.

Some categories must succeed, and are checked as such: valid images of
extreme sizes, TF's padding rule within the limit (one image, shape [k]), extreme
finite values (NaN and inf are refused by name), and a message of exactly --max-request-bytes.

What the decoders do with truncated files was measured by decoding every
prefix of each test image: every strict prefix is INVALID_ARGUMENT, except a
GIF missing only its one-byte trailer (';'), which giflib decodes: that case
must get OK and the right caption. Random bytes behind an image signature are
classified by TensorFlow's own decoder (`decodes`): INVALID_ARGUMENT unless
they happen to be a valid image.
"""
from __future__ import annotations

import base64
import binascii
import collections
import functools
import http.client
import io
import json
import re
import socket
import struct
import time
import zlib
from typing import Callable, Optional, Union
from urllib.parse import quote

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from PIL import Image
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.limits.image_headers import ImageHeaderError, check_pixels
from serving.tensors import ndarray_to_tensor_proto, short_dtype_name
from tests.serving.conftest import BLUE, GREEN, RED
from tests.serving.fixtures import (
    b64,
    expected_caption,
    publish_version,
    recv_until_closed,
    solid_image,
)
from tests.serving.test_server import png_header, predict_request

MAX_REQUEST_BYTES = 256 * 1024
MAX_IMAGE_PIXELS = 250_000
BATCH = 10  # requests between liveness checks
# A bomb is refused from its header, not by decoding it: in less time than this many
# requests with one image at the pixel limit (timed at the start of each run).
BOMB_DECODES = 20
SAMPLE = 2  # requests per category for the clean-log test's own server

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
OUTPUTS = ("attention", "caption", "lengths", "score", "tokens")
INPUT = {"serving_default": "image_bytes", "caption_annotations": "annotations"}
CAPTION = re.compile(r"^a (dark|bright) (red|green|blue) image$")

FUZZ = settings(deadline=None, derandomize=True, database=None,
                phases=(Phase.explicit, Phase.generate), print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much,
                                       HealthCheck.large_base_example])

# Names that look like paths: they are only ever looked up in the model table.
PATH_NAMES = ("../../etc/passwd", "..", ".", "/", "/etc/passwd", "../captioner", "./captioner",
              "captioner/", "/captioner", "captioner/1", "captioner/../captioner",
              "%2e%2e", "%2e%2e%2f%2e%2e%2fetc%2fpasswd", "..%2F..%2Fetc", "..\\..\\windows",
              "C:\\Windows\\System32", "file:///etc/passwd", "gs://bucket/model", "~", "~root",
              "$HOME", "*", "captioner*", "CAPTIONER", " captioner", "captioner ",
              "captioner\n", "captioner\x00", "\x00", "captioner\x00/../../etc", "",
              "outside", "../outside/secret/1")


# -- the server under test ------------------------------------------------------


def _start_server(model_store, serve_process, tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz") / "captioner"
    base.mkdir()
    publish_version(model_store["image"], str(base), 1)
    process = serve_process(["--model-base-path", str(base), "--port", "0", "--rest-port", "0",
                             "--poll-seconds", "1",
                             "--max-request-bytes", str(MAX_REQUEST_BYTES),
                             "--max-image-pixels", str(MAX_IMAGE_PIXELS)])
    process.base = str(base)
    process.rss_start = process.rss_mb()
    return process


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_store, serve_process):
    return _start_server(model_store, serve_process, tmp_path_factory)


@pytest.fixture(scope="module")
def channel(server):
    channel = grpc.insecure_channel(server.grpc_address)
    yield channel
    channel.close()


# -- images -------------------------------------------------------------------------


def image(rgb, width: int, height: int, fmt: str, noise: int = 0, seed: int = 0) -> bytes:
    """A width x height image of colour rgb (+- noise per pixel), encoded as fmt."""
    pixels = np.empty((height, width, 3), np.int16)
    pixels[:] = rgb
    if noise:
        pixels += np.random.RandomState(seed).randint(-noise, noise + 1, pixels.shape,
                                                      dtype=np.int16)
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, format=fmt)
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@functools.lru_cache(maxsize=None)
def png_bomb(width: int, height: int) -> bytes:
    """A complete, valid 1-bit PNG of zeros: tiny on the wire, 3 bytes a pixel decoded."""
    row = b"\x00" * (1 + (width + 7) // 8)
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    idat = zlib.compress(row * height, 9)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat)
            + _chunk(b"IEND", b""))


def gif_header(width: int, height: int, frames: int = 1) -> bytes:
    """A GIF whose screen and `frames` image descriptors claim width x height."""
    frame = (b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02"
             + b"\x02\x4c\x01\x00")
    return b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0) + frame * frames + b";"


def bmp_header(width: int, height: int, core: bool = False) -> bytes:
    """A BMP whose DIB header (40 bytes, or the 12-byte core one) claims width x height."""
    if core:
        dib = struct.pack("<IHHHH", 12, width, height, 1, 24)
    else:
        dib = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 0, 0, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(dib) + 64, 0, 0, 14 + len(dib)) + dib + b"\0" * 64


@functools.lru_cache(maxsize=None)
def _red_jpeg() -> bytes:
    return solid_image(RED, fmt="JPEG")


def jpeg_header(width: int, height: int) -> bytes:
    """A real JPEG whose SOF0 frame header is patched to claim width x height."""
    data = bytearray(_red_jpeg())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def webp_vp8x(width: int, height: int) -> bytes:
    body = (b"VP8X" + struct.pack("<I", 10) + b"\0" * 4 + (width - 1).to_bytes(3, "little")
            + (height - 1).to_bytes(3, "little"))
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def webp_vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | (height - 1) << 14
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits) + b"\0" * 8
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


# TF's decoders recognise these prefixes; anything else is "Unknown image file format".
MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM", b"RIFF", b"\xff\x0a",
         b"\x00\x00\x00\x0cJXL")
EMPTY = "Input is empty"
UNKNOWN = "Unknown image file format"
# format -> (bytes before the decoder recognises it, prefix lengths refused by the
# header check, messages any prefix may get)
TRUNCATION = {
    "PNG": (8, (8, 24, "truncated PNG header"),
            ("truncated PNG header", "Invalid PNG. Failed to initialize decoder",
             "Invalid PNG data")),
    "JPEG": (3, None, ("truncated JPEG: no frame header", "truncated JPEG header",
                       "jpeg::Uncompress failed. Invalid JPEG data")),
    "GIF": (4, (6, 13, "truncated GIF header"),
            ("truncated GIF header", "failed to open gif file", "failed to slurp gif file")),
    "BMP": (2, (2, 32, "Incomplete bmp content"),
            ("Incomplete bmp content", "Input size should match")),
    "WEBP": (12, (12, 30, "truncated WebP header"),
             ("truncated WebP header", "Failed to decode WebP image")),
}


def any_of(*texts: str) -> re.Pattern:
    return re.compile("|".join(re.escape(t) for t in texts))


@functools.lru_cache(maxsize=4096)
def decodes(data: bytes) -> bool:
    """Whether TensorFlow's decoder (the one the model runs) accepts these bytes."""
    try:
        tf.io.decode_image(data, channels=3, expand_animations=False)
        return True
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        return False


# -- expectations ----------------------------------------------------------------------


class Case:
    """One request and the status it must get (a plain class: Hypothesis prints its repr).

    Args:
      category: for the counts.
      call: predict | metadata | status | raw (bytes sent as a PredictRequest).
      request: the request message (or bytes).
      code: the status it must get.
      text: a fragment (str) or pattern the details must hold; None: any.
      check: called with an OK response.
      max_decodes: the most the answer may take, in requests with one image at the
        pixel limit.
    """

    def __init__(self, category: str, call: str, request, code: grpc.StatusCode,
                 text: Union[str, re.Pattern, None] = None, check: Optional[Callable] = None,
                 max_decodes: Optional[float] = None, note: str = ""):
        self.category, self.call, self.request, self.code = category, call, request, code
        self.text, self.check, self.max_decodes, self.note = text, check, max_decodes, note

    def __repr__(self) -> str:
        size = (len(self.request) if isinstance(self.request, bytes)
                else self.request.ByteSize())
        text = self.text.pattern if isinstance(self.text, re.Pattern) else self.text
        return (f"Case({self.category}, {self.call}, {size} bytes, want {self.code.name} "
                f"{str(text)[:200]!r} {self.note[:200]})")


def details_match(details: str, text) -> bool:
    if text is None:
        return True
    if isinstance(text, re.Pattern):
        return bool(text.search(details))
    if text in details:
        return True
    # Long details are cut by the server to fit gRPC trailers (serving/server/model_server.py).
    head, cut, _ = details.rpartition("... (")
    return (bool(cut) and details.endswith(" more characters)") and len(head) >= 100
            and text.startswith(head))


def image_request(images, signature: str = "", **spec) -> predict_pb2.PredictRequest:
    return predict_request(list(images), signature=signature, **spec)


def captions(rows: int, caption: Union[str, re.Pattern]):
    """A check: `rows` captions, all equal to (or matching) `caption`."""
    def check(response):
        got = [c.decode() for c in response.outputs["caption"].string_val]
        assert len(got) == rows, got[:5]
        for c in got:
            assert (caption.match(c) if isinstance(caption, re.Pattern) else c == caption), c
    return check


def expect_image(data: bytes, category: str, limit: int = MAX_IMAGE_PIXELS) -> Case:
    """The case for one arbitrary byte string sent as the image."""
    request = image_request([data])
    if not data:
        return Case(category, "predict", request, INVALID, EMPTY)
    if not data.startswith(MAGIC):
        return Case(category, "predict", request, INVALID, UNKNOWN)
    try:
        check_pixels(data, limit)
    except ImageHeaderError:
        return Case(category, "predict", request, INVALID, "input image_bytes[0]: ",
                    note="refused from its header")
    if decodes(data):  # a valid image by chance: it must then be captioned
        return Case(category, "predict", request, OK, check=captions(1, CAPTION),
                    note="decodes")
    return Case(category, "predict", request, INVALID, note="undecodable")


# -- gRPC strategies ---------------------------------------------------------------------

COLORS = (RED, BLUE, GREEN)
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
names = st.text(max_size=40)
int64s = st.integers(-2 ** 63, 2 ** 63 - 1)


@st.composite
def random_bytes(draw):
    return expect_image(draw(st.binary(max_size=2048)), "random_bytes")


@st.composite
def magic_garbage(draw):
    data = draw(st.sampled_from(MAGIC)) + draw(st.binary(max_size=600))
    return expect_image(data, "magic_garbage")


@functools.lru_cache(maxsize=None)
def truncation_source(fmt: str, rgb, size: int, noise: int) -> bytes:
    return image(rgb, size, size, fmt, noise=noise)


@st.composite
def truncated(draw):
    fmt = draw(st.sampled_from(FORMATS))
    rgb = draw(st.sampled_from(COLORS))
    size, noise = draw(st.sampled_from([(8, 0), (16, 20), (40, 30)]))
    full = truncation_source(fmt, rgb, size, noise)
    # Many cuts fall in the first 40 bytes (the headers); a GIF may lose just its trailer.
    n = draw(st.one_of(st.integers(0, min(40, len(full) - 1)), st.integers(0, len(full) - 1),
                       st.just(len(full) - 1)))
    data = full[:n]
    request = image_request([data])
    magic, header, messages = TRUNCATION[fmt]
    note = f"{fmt} {size}px cut to {n}/{len(full)}"
    if n == 0:
        return Case("truncated", "predict", request, INVALID, EMPTY, note=note)
    if n < magic:
        return Case("truncated", "predict", request, INVALID, UNKNOWN, note=note)
    if fmt == "GIF" and n == len(full) - 1:
        assert full.endswith(b";")  # only the trailer is missing: giflib decodes it
        return Case("truncated", "predict", request, OK,
                    check=captions(1, expected_caption(rgb)), note=note + " (no trailer)")
    if header and header[0] <= n < header[1]:
        return Case("truncated", "predict", request, INVALID, header[2], note=note)
    return Case("truncated", "predict", request, INVALID, any_of(*messages), note=note)


def _over(draw, max_dim: int, min_dim: int = 1):
    """(w, h), both in [min_dim, max_dim], with w * h over the pixel limit."""
    w = draw(st.integers(max(min_dim, MAX_IMAGE_PIXELS // max_dim + 1), max_dim))
    h = draw(st.integers(max(min_dim, MAX_IMAGE_PIXELS // w + 1), max_dim))
    return w, h


def _too_many(fmt: str, w: int, h: int, frames: int = 1) -> str:
    more = f" x {frames} frames" if frames > 1 else ""
    return (f"{fmt} image of {w}x{h}{more} = {w * h * frames} pixels exceeds the limit of "
            f"{MAX_IMAGE_PIXELS} pixels")


@st.composite
def bomb(draw):
    kind = draw(st.sampled_from(["png", "gif", "gif_frames", "bmp", "bmp_core", "jpeg",
                                 "webp_vp8x", "webp_vp8l", "real_png", "empty"]))
    if kind == "png":
        w, h = _over(draw, 2 ** 31 - 1)
        data, text = png_header(w, h), _too_many("PNG", w, h)
    elif kind == "gif":
        w, h = _over(draw, 65535)
        data, text = gif_header(w, h), _too_many("GIF", w, h)
    elif kind == "gif_frames":  # each frame is small; together they are not
        w, h = draw(st.integers(10, 300)), draw(st.integers(10, 300))
        frames = MAX_IMAGE_PIXELS // (w * h) + 1 + draw(st.integers(0, 3))
        data, text = gif_header(w, h, frames), _too_many("GIF", w, h, frames)
    elif kind in ("bmp", "bmp_core"):
        core = kind == "bmp_core"
        w, h = _over(draw, 65535 if core else 2 ** 31 - 1)
        flip = not core and draw(st.booleans())  # negative height: top-down rows
        data, text = bmp_header(w, -h if flip else h, core), _too_many("BMP", w, h)
    elif kind == "jpeg":
        w, h = _over(draw, 65535)
        data, text = jpeg_header(w, h), _too_many("JPEG", w, h)
    elif kind == "webp_vp8x":
        w, h = _over(draw, 2 ** 24)
        data, text = webp_vp8x(w, h), _too_many("WebP", w, h)
    elif kind == "webp_vp8l":
        w, h = _over(draw, 2 ** 14)
        data, text = webp_vp8l(w, h), _too_many("WebP", w, h)
    elif kind == "real_png":  # complete, valid PNGs: decompression bombs, or just over
        w, h = draw(st.sampled_from([(20000, 20000), (4000, 60000), (MAX_IMAGE_PIXELS + 1, 1),
                                     (501, 500)]))
        data, text = png_bomb(w, h), _too_many("PNG", w, h)
    else:
        fmt = draw(st.sampled_from(["PNG", "GIF", "BMP", "JPEG"]))
        w, h = draw(st.sampled_from([(0, 10), (10, 0), (0, 0)]))
        data = {"PNG": png_header, "GIF": gif_header, "BMP": bmp_header,
                "JPEG": jpeg_header}[fmt](w, h)
        text = f"{fmt} header gives an empty size {w}x{h}"
    return Case("bomb", "predict", image_request([data]), INVALID, text,
                max_decodes=BOMB_DECODES, note=f"{kind} {len(data)} bytes")


MAX_SIDE = {"PNG": MAX_IMAGE_PIXELS, "JPEG": 65500, "GIF": 65535, "BMP": 60000, "WEBP": 16383}


@st.composite
def extreme_valid(draw):
    """Valid images of extreme shapes within the pixel limit: they must be captioned."""
    fmt = draw(st.sampled_from(FORMATS))
    rgb = draw(st.sampled_from(COLORS))
    side = MAX_SIDE[fmt]
    pixels = MAX_IMAGE_PIXELS if fmt != "BMP" else 60_000  # BMP is uncompressed
    edge = [(1, 1), (1, 2), (2, 1), (1, 2000), (2000, 1), (1, side), (side, 1)]
    if fmt != "BMP":
        edge += [(500, 500), (250, 1000)]  # exactly at the limit
    if draw(st.booleans()):
        w, h = draw(st.sampled_from(edge))
    else:
        w = draw(st.integers(1, 2000))
        h = draw(st.integers(1, min(2000, pixels // w)))
    data = image(rgb, w, h, fmt)
    return Case("extreme_valid", "predict", image_request([data]), OK,
                check=captions(1, expected_caption(rgb)), note=f"{fmt} {w}x{h}")


DTYPES = sorted(types_pb2.DataType.values())


@st.composite
def wrong_dtype(draw):
    signature = draw(st.sampled_from(sorted(INPUT)))
    want = types_pb2.DT_STRING if signature == "serving_default" else types_pb2.DT_FLOAT
    dtype = draw(st.one_of(st.sampled_from(DTYPES), st.integers(-2 ** 31, 2 ** 31 - 1)))
    assume(dtype != want)
    proto = tensor_pb2.TensorProto(dtype=dtype)
    for d in draw(st.lists(st.integers(0, 4), max_size=3)):
        proto.tensor_shape.dim.add().size = d
    proto.tensor_content = draw(st.binary(max_size=64))
    request = predict_request(signature=signature)
    request.inputs[INPUT[signature]].CopyFrom(proto)
    wanted = "string" if signature == "serving_default" else "float32"
    return Case("wrong_dtype", "predict", request, INVALID,
                f"Expects arg[0] to be {wanted} but {short_dtype_name(dtype)} is provided")


@st.composite
def wrong_shape(draw):
    kind = draw(st.sampled_from(["image_rank", "annotations_shape", "annotations_cells"]))
    if kind == "image_rank":
        shape = draw(st.sampled_from([(), (1, 1), (2, 1), (1, 2, 1), (0, 3), (1, 1, 1, 1)]))
        array = np.empty(shape, dtype=object)
        array.reshape(-1)[:] = [solid_image(RED)] * array.size
        request = predict_request()
        request.inputs["image_bytes"].CopyFrom(ndarray_to_tensor_proto(array))
        return Case("wrong_shape", "predict", request, INVALID,
                    f"input image_bytes: shape {list(shape)} is not compatible with the "
                    f"signature's [?]")
    request = predict_request(signature="caption_annotations")
    if kind == "annotations_shape":  # rank != 3 or last dimension != 3
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=5)))
        assume(len(shape) != 3 or shape[2] != 3)
        request.inputs["annotations"].CopyFrom(ndarray_to_tensor_proto(
            np.zeros(shape, np.float32)))
        return Case("wrong_shape", "predict", request, INVALID,
                    f"input annotations: shape {list(shape)} is not compatible with the "
                    f"signature's [?,?,3]")
    # The signature takes any number of cells; the model needs 3 x 3 = 9.
    batch, cells = draw(st.integers(1, 4)), draw(st.integers(0, 30).filter(lambda c: c != 9))
    request.inputs["annotations"].CopyFrom(ndarray_to_tensor_proto(
        np.full((batch, cells, 3), 100.0, np.float32)))
    return Case("wrong_shape", "predict", request, INVALID,
                f"Input to reshape is a tensor with {batch * 6 * cells} values, but the "
                f"requested shape has {batch * 54}")


@st.composite
def empty_batch(draw):
    """Zero images (shape [0] or [0, L, 3]): INVALID_ARGUMENT, like REST's `"instances": []`."""
    if draw(st.booleans()):
        request = predict_request([])
    else:
        request = predict_request(signature="caption_annotations")
        request.inputs["annotations"].CopyFrom(ndarray_to_tensor_proto(
            np.zeros((0, draw(st.integers(0, 20)), 3), np.float32)))
    return Case("empty_batch", "predict", request, INVALID, "empty batch")


@st.composite
def bad_tensor(draw):
    kind = draw(st.sampled_from(["negative", "unknown_rank", "string_content", "too_many",
                                 "content_size", "rank_65", "too_large", "padding_bomb"]))
    signature = draw(st.sampled_from(sorted(INPUT)))
    alias = INPUT[signature]
    dtype = types_pb2.DT_STRING if alias == "image_bytes" else types_pb2.DT_FLOAT
    proto = tensor_pb2.TensorProto(dtype=dtype)
    shape = []
    if kind == "negative":
        shape = draw(st.lists(st.integers(-2 ** 63, 4), min_size=1, max_size=4))
        assume(any(d < 0 for d in shape))
        text = f"tensor shape {shape} has a negative size"
    elif kind == "unknown_rank":
        proto.tensor_shape.unknown_rank = True
        text = "tensor shape has unknown rank"
    elif kind == "string_content":
        dtype = proto.dtype = types_pb2.DT_STRING
        shape = [1]
        proto.tensor_content = draw(st.binary(min_size=1, max_size=64))
        text = "string tensors cannot use tensor_content"
        alias = "image_bytes"
        signature = "serving_default"
    elif kind == "too_many":
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        n = int(np.prod(shape)) if shape else 1
        extra = draw(st.integers(1, 5))
        if dtype == types_pb2.DT_STRING:
            proto.string_val.extend([b"x"] * (n + extra))
        else:
            proto.float_val.extend([1.0] * (n + extra))
        text = f"{n + extra} values for shape {shape} ({n} elements)"
    elif kind == "content_size":
        dtype = proto.dtype = types_pb2.DT_FLOAT
        alias, signature = "annotations", "caption_annotations"
        shape = [draw(st.integers(0, 3)), 9, 3]
        n = shape[0] * 27
        size = draw(st.integers(1, 4 * n + 16).filter(lambda s: s != 4 * n))
        proto.tensor_content = b"\0" * size
        text = f"tensor_content has {size} bytes, shape {shape} of float needs {4 * n}"
    elif kind == "rank_65":
        shape = [1] * draw(st.integers(65, 200))
        text = f"tensor rank {len(shape)} exceeds 64"
    elif kind == "too_large":  # the element count overflows int64 (or nearly)
        shape = [draw(st.integers(2 ** 32, 2 ** 63 - 1)), draw(st.integers(2 ** 32, 2 ** 63 - 1))]
        text = f"tensor shape {shape} is too large"
    else:  # a few bytes claiming a huge shape: refused before anything is allocated
        n = draw(st.integers(MAX_REQUEST_BYTES + 1, 2 ** 40))
        if alias == "image_bytes":
            shape = [n]
            if draw(st.booleans()):
                proto.string_val.append(solid_image(RED))
        else:
            shape = [n, 9, 3]
            n *= 27
            proto.float_val.append(1.0)
        text = f"tensor shape {shape} has {n} elements, more than the limit of {MAX_REQUEST_BYTES}"
    for d in shape:
        proto.tensor_shape.dim.add().size = d
    request = predict_request(signature=signature)
    request.inputs[alias].CopyFrom(proto)
    return Case("bad_tensor", "predict", request, INVALID,
                f"tensor parsing error: {alias} ({text})", max_decodes=BOMB_DECODES, note=kind)


@st.composite
def padded_batch(draw):
    """One image with shape [k]: TF's padding rule repeats it k times (valid)."""
    k = draw(st.integers(1, 24))
    rgb = draw(st.sampled_from(COLORS))
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING)
    proto.tensor_shape.dim.add().size = k
    proto.string_val.append(solid_image(rgb))
    request = predict_request()
    request.inputs["image_bytes"].CopyFrom(proto)
    return Case("padded_batch", "predict", request, OK, check=captions(k, expected_caption(rgb)))


@st.composite
def nonfinite_values(draw):
    """Extreme finite floats are values (captions come back); NaN and inf are refused by name."""
    batch = draw(st.integers(1, 3))
    values = draw(st.lists(st.floats(width=32), min_size=batch * 27, max_size=batch * 27))
    array = np.asarray(values, np.float32).reshape(batch, 9, 3)
    request = predict_request(signature="caption_annotations")
    request.inputs["annotations"].CopyFrom(ndarray_to_tensor_proto(array))
    if not np.isfinite(array).all():
        return Case("nonfinite_values", "predict", request, INVALID,
                    "input 'annotations' holds")
    return Case("nonfinite_values", "predict", request, OK, check=captions(batch, CAPTION))


def _long_name(draw) -> str:
    return draw(st.sampled_from("x/.é\x00")) * draw(st.integers(5_000, 100_000))


@st.composite
def unknown_model(draw):
    if draw(st.integers(0, 9)) == 0:
        name = _long_name(draw)
    else:
        name = draw(st.one_of(st.sampled_from(PATH_NAMES), names))
    assume(name != "captioner")
    call = draw(st.sampled_from(["predict", "metadata", "status"]))
    version = draw(st.one_of(st.none(), int64s))
    spec = {} if version is None else {"version": {"value": version}}
    which = "Latest(%s)" % name if version is None else f"Specific({name}, {version})"
    if call == "predict":
        request, text = image_request([solid_image(RED)], name=name, **spec), \
            f"Servable not found for request: {which}"
    elif call == "metadata":
        request = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=model_pb2.ModelSpec(name=name, **spec), metadata_field=["signature_def"])
        text = f"Servable not found for request: {which}"
    else:
        request = get_model_status_pb2.GetModelStatusRequest(
            model_spec=model_pb2.ModelSpec(name=name, **spec))
        text = (f"Could not find any versions of model {name}" if version is None
                else f"Could not find version {version} of model {name}")
    return Case("unknown_model", call, request, NOT_FOUND, text)


@st.composite
def unknown_version(draw):
    version = draw(int64s.filter(lambda v: v != 1))
    call = draw(st.sampled_from(["predict", "metadata", "status"]))
    spec = model_pb2.ModelSpec(name="captioner", version={"value": version})
    if call == "predict":
        request = image_request([solid_image(RED)], version={"value": version})
        text = f"Servable not found for request: Specific(captioner, {version})"
    elif call == "metadata":
        request = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=spec, metadata_field=["signature_def"])
        text = f"Servable not found for request: Specific(captioner, {version})"
    else:
        request = get_model_status_pb2.GetModelStatusRequest(model_spec=spec)
        text = f"Could not find version {version} of model captioner"
    return Case("unknown_version", call, request, NOT_FOUND, text)


@st.composite
def unknown_label(draw):
    label = draw(st.one_of(st.text(min_size=1, max_size=40), st.sampled_from(PATH_NAMES)))
    assume(label)
    call = draw(st.sampled_from(["predict", "metadata", "status"]))
    spec = model_pb2.ModelSpec(name="captioner", version_label=label)
    if call == "predict":
        request = image_request([solid_image(RED)], version_label=label)
    elif call == "metadata":
        request = get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=spec, metadata_field=["signature_def"])
    else:
        request = get_model_status_pb2.GetModelStatusRequest(model_spec=spec)
    return Case("unknown_label", call, request, INVALID,
                f"Unrecognized servable version label: {label}")


@st.composite
def unknown_signature(draw):
    signature = draw(st.one_of(names, st.sampled_from(PATH_NAMES)))
    assume(signature not in ("", "serving_default", "caption_annotations"))
    return Case("unknown_signature", "predict", image_request([solid_image(RED)], signature),
                grpc.StatusCode.FAILED_PRECONDITION,
                f'Serving signature key "{signature}" not found.')


@st.composite
def bad_inputs(draw):
    """Unknown, extra or missing inputs (also thousands of them: the details are cut)."""
    signature = draw(st.sampled_from(sorted(INPUT)))
    expected = INPUT[signature]
    if draw(st.integers(0, 9)) == 0:
        sent = {expected} | {f"extra{i:05d}_{'y' * 40}" for i in range(draw(
            st.integers(200, 2500)))}
    else:
        sent = set(draw(st.sets(st.text(max_size=20), max_size=4)))
        if draw(st.booleans()):
            sent.add(expected)
    assume(sent != {expected})
    request = predict_request(signature=signature)
    for name in sent:
        request.inputs[name].CopyFrom(ndarray_to_tensor_proto(np.zeros(1, np.float32)))
    extra, missing = sorted(sent - {expected}), sorted({expected} - sent)
    text = (f"input size does not match signature: {len(sent)}!=1 len({{{','.join(sorted(sent))}}})"
            f" != len({{{expected}}}). Sent extra: {{{','.join(extra)}}}. "
            f"Missing but required: {{{','.join(missing)}}}.")
    return Case("bad_inputs", "predict", request, INVALID, text, note=f"{len(sent)} inputs")


@st.composite
def bad_output_filter(draw):
    wanted = draw(st.lists(st.one_of(st.sampled_from(OUTPUTS), names), min_size=1, max_size=6))
    seen, text = set(), None
    for alias in wanted:  # the first offending alias is reported
        if alias not in OUTPUTS:
            text = (f"output tensor alias not found in signature: {alias} Outputs expected to "
                    f"be in the set {{{','.join(OUTPUTS)}}}.")
            break
        if alias in seen:
            text = f"duplicate output tensor alias: {alias}"
            break
        seen.add(alias)
    assume(text is not None)
    request = image_request([solid_image(RED)])
    request.output_filter.extend(wanted)
    return Case("bad_output_filter", "predict", request, INVALID, text)


@st.composite
def metadata_fault(draw):
    kind = draw(st.sampled_from(["no_spec", "no_field", "bad_field", "status_no_spec"]))
    if kind == "status_no_spec":
        return Case("metadata_fault", "status", get_model_status_pb2.GetModelStatusRequest(),
                    INVALID, "Missing ModelSpec")
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    if kind != "no_spec":
        request.model_spec.name = draw(st.sampled_from(["captioner", "nope"]))
    if kind == "no_spec":
        request.metadata_field.append("signature_def")
        text = "Missing ModelSpec"
    elif kind == "no_field":
        text = "GetModelMetadataRequest must specify at least one metadata_field"
    else:
        field = draw(names.filter(lambda f: f != "signature_def"))
        request.metadata_field.extend(["signature_def", field])
        text = f"Metadata field {field} is not supported"
    return Case("metadata_fault", "metadata", request, INVALID, text)


@st.composite
def raw_bytes(draw):
    """Bytes that may not even be a PredictRequest, sent as one."""
    data = draw(st.binary(max_size=512))
    try:
        request = predict_pb2.PredictRequest.FromString(data)
    except DecodeError:  # gRPC answers INTERNAL before the servicer runs
        return Case("raw_bytes", "raw", data, grpc.StatusCode.INTERNAL,
                    "Exception deserializing request!")
    spec = request.model_spec
    assume(spec.name != "captioner")
    if spec.version_label:
        return Case("raw_bytes", "raw", data, INVALID, "Unrecognized servable version label")
    return Case("raw_bytes", "raw", data, NOT_FOUND, "Servable not found for request")


def request_of_size(size: int) -> predict_pb2.PredictRequest:
    """A valid request (red PNG padded with a private chunk) of exactly `size` bytes."""
    png = solid_image(RED)
    pad = size - image_request([png]).ByteSize()
    while True:
        data = png[:33] + _chunk(b"prVt", b"\0" * max(pad, 0)) + png[33:]
        request = image_request([data])
        if request.ByteSize() == size or pad < 0:
            return request
        pad += size - request.ByteSize()


@st.composite
def oversized(draw):
    if draw(st.integers(0, 4)) == 0:  # at the limit: still served
        size = draw(st.integers(MAX_REQUEST_BYTES - 64, MAX_REQUEST_BYTES))
        request = request_of_size(size)
        assert request.ByteSize() == size
        return Case("at_limit", "predict", request, OK, check=captions(1, expected_caption(RED)))
    size = draw(st.integers(MAX_REQUEST_BYTES + 1, 4 * MAX_REQUEST_BYTES))
    request = request_of_size(size)
    assert request.ByteSize() == size
    return Case("oversized", "predict", request, grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({size} vs. {MAX_REQUEST_BYTES})")


# Examples per category (each its own Hypothesis run, so every category gets its
# share; the small spaces, like empty_batch, run out before their budget).
GRPC_BUDGET = {
    "random_bytes": (random_bytes(), 100), "magic_garbage": (magic_garbage(), 100),
    "truncated": (truncated(), 120), "bomb": (bomb(), 120),
    "extreme_valid": (extreme_valid(), 60), "wrong_dtype": (wrong_dtype(), 60),
    "wrong_shape": (wrong_shape(), 60), "empty_batch": (empty_batch(), 30),
    "bad_tensor": (bad_tensor(), 80), "padded_batch": (padded_batch(), 30),
    "nonfinite_values": (nonfinite_values(), 30), "unknown_model": (unknown_model(), 80),
    "unknown_version": (unknown_version(), 40), "unknown_label": (unknown_label(), 40),
    "unknown_signature": (unknown_signature(), 40), "bad_inputs": (bad_inputs(), 40),
    "bad_output_filter": (bad_output_filter(), 40), "metadata_fault": (metadata_fault(), 30),
    "raw_bytes": (raw_bytes(), 60), "oversized": (oversized(), 40),
}


class GrpcClient:
    def __init__(self, channel):
        predictions = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        self.calls = {
            "predict": predictions.Predict, "metadata": predictions.GetModelMetadata,
            "status": models.GetModelStatus,
            "raw": channel.unary_unary("/tensorflow.serving.PredictionService/Predict")}

    def send(self, case: Case):
        """(code, details, response, seconds)."""
        started = time.monotonic()
        try:
            response = self.calls[case.call](case.request, timeout=60)
            return OK, "", response, time.monotonic() - started
        except grpc.RpcError as e:
            return e.code(), e.details() or "", None, time.monotonic() - started


def check_alive_grpc(server, client: GrpcClient):
    assert server.alive(), "the server died:\n" + server.log()[-3000:]
    response = client.calls["predict"](image_request([solid_image(BLUE, fmt="JPEG")]),
                                       timeout=60)
    assert [c.decode() for c in response.outputs["caption"].string_val] == [
        expected_caption(BLUE)]


def time_at_the_pixel_limit(client: GrpcClient) -> float:
    """Seconds a request with one image of MAX_IMAGE_PIXELS takes (median of 3)."""
    side = int(MAX_IMAGE_PIXELS ** 0.5)
    case = Case("calibration", "predict", image_request([image(BLUE, side, side, "PNG")]),
                OK)
    times = []
    for _ in range(3):
        code, details, _, seconds = client.send(case)
        assert code == OK, details
        times.append(seconds)
    return sorted(times)[1]


def summary(title: str, counts: collections.Counter, codes: collections.Counter) -> str:
    per_category = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    per_code = " ".join(f"{k}={v}" for k, v in sorted(codes.items()))
    return f"{title}: total={sum(counts.values())} | {per_category} | codes: {per_code}"


def assert_log_clean(server) -> None:
    """No request reached the server's catch-all handlers (unexpected exceptions)."""
    log = server.log()
    assert "unexpected error" not in log, log[-3000:]
    assert not re.search(r"REST \w+ \S+ failed", log), log[-3000:]


def grpc_fuzz(server, channel, budget) -> tuple:
    """Sends `budget`'s cases over gRPC, checking each: (counts, codes, slowest, kinds)."""
    client = GrpcClient(channel)
    counts, codes, slowest = collections.Counter(), collections.Counter(), collections.Counter()
    kinds = collections.Counter()
    decode = time_at_the_pixel_limit(client)
    print(f"\nan image at the pixel limit: {decode * 1000:.0f} ms; a bomb's refusal may take "
          f"{BOMB_DECODES * decode:.2f} s")

    def fuzz(case):
        code, details, response, seconds = client.send(case)
        counts[case.category] += 1
        codes[code.name] += 1
        slowest[case.category] = max(slowest[case.category], seconds)
        if case.category in ("bomb", "bad_tensor"):
            kinds[f"{case.category}:{case.note.split()[0]}"] += 1
        elif case.category == "truncated":
            kinds[f"truncated:{case.code.name}"] += 1
        assert code == case.code, f"{case!r}: got {code.name}: {details[:500]}"
        assert details_match(details, case.text), f"{case!r}: got {details[:500]!r}"
        if case.check is not None:
            case.check(response)
        if case.max_decodes is not None and seconds >= case.max_decodes * decode:
            seconds = min(seconds, client.send(case)[3])  # once more: a busy host's pause?
            assert seconds < case.max_decodes * decode, (
                f"{case!r}: took {seconds:.2f}s, {seconds / decode:.1f} times an image at "
                f"the pixel limit")
        if sum(counts.values()) % BATCH == 0:
            check_alive_grpc(server, client)

    for strategy, examples in budget.values():
        settings(FUZZ, max_examples=examples)(given(strategy)(fuzz))()
    check_alive_grpc(server, client)
    return counts, codes, slowest, kinds


def test_grpc_fuzz(server, channel):
    counts, codes, slowest, kinds = grpc_fuzz(server, channel, GRPC_BUDGET)
    assert_log_clean(server)
    line = summary("gRPC fuzz", counts, codes)
    print("\n" + line)
    print("gRPC kinds: " + " ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
    print("gRPC slowest per category (s): " + " ".join(
        f"{k}={v:.3f}" for k, v in sorted(slowest.items())))
    assert sum(counts.values()) >= 1000, line
    assert all(counts[c] >= 10 for c in (
        "random_bytes", "magic_garbage", "truncated", "bomb", "extreme_valid", "wrong_dtype",
        "wrong_shape", "empty_batch", "bad_tensor", "padded_batch", "unknown_model",
        "unknown_version", "unknown_label", "unknown_signature", "bad_inputs",
        "bad_output_filter", "metadata_fault", "raw_bytes", "oversized")), line


# -- REST ---------------------------------------------------------------------------------


class RestCase:
    """One HTTP request and the status it must get; `raw`: a whole request for a socket."""

    def __init__(self, category: str, method: str, path: str, body: Optional[bytes],
                 status: Union[int, str], text: Union[str, re.Pattern, None] = None,
                 raw: Optional[bytes] = None):
        self.category, self.method, self.path, self.body = category, method, path, body
        self.status, self.text, self.raw = status, text, raw

    def __repr__(self) -> str:
        size = len(self.raw if self.raw is not None else self.body or b"")
        text = self.text.pattern if isinstance(self.text, re.Pattern) else self.text
        return (f"RestCase({self.category}, {self.method} {self.path[:200]!r}, {size} bytes, "
                f"want {self.status} {str(text)[:200]!r})")


PREDICT = "/v1/models/captioner:predict"


def body_case(category: str, doc, status: int, text, path: str = PREDICT) -> RestCase:
    return RestCase(category, "POST", path, json.dumps(doc).encode(), status, text)


def json_expect(category: str, body: bytes) -> RestCase:
    """A body that is (most likely) not a predict request."""
    if not body:
        return RestCase(category, "POST", PREDICT, body, 400,
                        "JSON Parse error: The document is empty")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return RestCase(category, "POST", PREDICT, body, 400, "JSON Parse error")
    if not isinstance(doc, dict):
        return RestCase(category, "POST", PREDICT, body, 400,
                        "JSON Value: request body is not an object")
    return RestCase(category, "POST", PREDICT, body, 400)  # a random object: still a 400


@st.composite
def malformed_json(draw):
    kind = draw(st.sampled_from(["text", "bytes", "truncated", "deep", "huge_number"]))
    if kind == "text":
        body = draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    elif kind == "bytes":
        body = draw(st.binary(max_size=400))
    elif kind == "truncated":
        doc = json.dumps({"signature_name": "serving_default",
                          "instances": [b64(solid_image(RED))]}).encode()
        body = doc[:draw(st.integers(0, len(doc) - 1))]
    elif kind == "deep":
        body = b"[" * draw(st.integers(1000, 50_000))
        if draw(st.booleans()):
            body = b'{"instances": ' + body
    else:
        body = b'{"instances": [' + b"9" * draw(st.integers(5000, 20000)) + b"]}"
    return json_expect("malformed_json", body)


@st.composite
def bad_base64(draw):
    text = draw(st.one_of(st.text(max_size=60),
                          st.text(alphabet="ABCDabcd0123+/=-_ \n", max_size=60)))
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return body_case("bad_base64", {"instances": [{"b64": text}]}, 400,
                         "Unable to base64 decode")
    case = expect_image(data, "bad_base64")  # valid base64 of junk: an image error
    status = 200 if case.code == OK else 400
    return body_case("bad_base64", {"instances": [{"b64": text}]}, status, case.text)


scalars = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=False,
                    allow_infinity=False), st.booleans(), st.none())


@st.composite
def wrong_json(draw):
    image_ = b64(solid_image(RED))
    kind = draw(st.sampled_from(["scalars", "not_list", "empty", "ragged", "level", "nested",
                                 "keys", "signature_type", "both", "annotations_type",
                                 "annotations_shape", "unknown_signature", "missing",
                                 "missing_input", "text_instance"]))
    if kind == "scalars":
        values = draw(st.lists(scalars, min_size=1, max_size=4))
        return body_case("wrong_json", {"instances": values}, 400,
                         "is not of expected type: string")
    if kind == "not_list":
        value = draw(st.one_of(scalars, st.text(max_size=10),
                               st.dictionaries(st.text(max_size=5), scalars, max_size=2)))
        assume(not (isinstance(value, dict) and set(value) == {"b64"}))
        return body_case("wrong_json", {"instances": value}, 400,
                         "Excepting 'instances' to be an list/array")
    if kind == "empty":
        return body_case("wrong_json", {"instances": []}, 400, "No values in 'instances' array")
    if kind == "ragged":
        return body_case("wrong_json", {"instances": [[image_], [image_, image_]]}, 400,
                         "Encountered list at unexpected size: 2 at level: 1 expected size: 1")
    if kind == "level":
        return body_case("wrong_json", {"instances": [image_, [image_]]}, 400,
                         "Encountered list at unexpected level: 1 expected < 1")
    if kind == "nested":
        depth = draw(st.integers(2, 5))
        value = image_
        for _ in range(depth - 1):
            value = [value]
        shape = ", ".join(["1"] * depth)
        return body_case("wrong_json", {"instances": [value]}, 400,
                         f"input image_bytes: shape [{shape}] is not compatible")
    if kind == "keys":
        keys = draw(st.sets(st.text(max_size=8), min_size=1, max_size=3))
        assume(keys != {"image_bytes"} and keys != {"b64"})
        return body_case("wrong_json", {"instances": [{k: image_ for k in keys}]}, 400,
                         "JSON object keys must be equal to: image_bytes")
    if kind == "signature_type":
        value = draw(st.one_of(st.integers(), st.lists(st.integers(), max_size=2),
                               st.booleans(), st.none()))
        return body_case("wrong_json", {"signature_name": value, "instances": [image_]}, 400,
                         "'signature_name' key must be a string value.")
    if kind == "both":
        return body_case("wrong_json", {"instances": [image_], "inputs": [image_]}, 400,
                         "expecting only one of 'inputs' or 'instances' keys to exist")
    if kind == "annotations_type":
        bad = draw(st.one_of(st.text(max_size=5), st.booleans(), st.none()))
        return body_case("wrong_json", {"signature_name": "caption_annotations",
                                        "inputs": [[[bad, 1.0, 2.0]]]}, 400,
                         "is not of expected type: float32")
    if kind == "annotations_shape":
        shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))
        assume(len(shape) != 3 or shape[2] != 3)
        return body_case("wrong_json", {"signature_name": "caption_annotations",
                                        "inputs": np.zeros(shape).tolist()}, 400,
                         "is not compatible with the signature's [?,?,3]")
    if kind == "unknown_signature":
        name = draw(st.one_of(names, st.sampled_from(PATH_NAMES)))
        assume(name not in ("", "serving_default", "caption_annotations"))
        return body_case("wrong_json", {"signature_name": name, "instances": [image_]}, 400,
                         f'Serving signature name: "{name}" not found in signature def')
    if kind == "missing":
        doc = draw(st.dictionaries(st.text(max_size=8), scalars, max_size=3))
        assume(not {"instances", "inputs", "signature_name"} & set(doc))
        return body_case("wrong_json", doc, 400, "Missing 'inputs' or 'instances' key")
    if kind == "missing_input":
        key = draw(st.text(max_size=8).filter(lambda k: k not in ("image_bytes", "b64")))
        return body_case("wrong_json", {"inputs": {key: [image_]}}, 400,
                         "Missing named input: image_bytes in 'inputs' object.")
    text = "x" + draw(st.text(max_size=40))  # plain text, not base64: not an image
    return body_case("wrong_json", {"instances": [text]}, 400, UNKNOWN)


@st.composite
def huge_body(draw):
    kind = draw(st.sampled_from(["body", "body", "claimed", "bad_length", "chunked",
                                 "no_length"]))
    if kind == "body":  # read and dropped, then 413
        size = draw(st.integers(MAX_REQUEST_BYTES + 1, 8 * MAX_REQUEST_BYTES))
        return RestCase("huge_body", "POST", PREDICT, b"{" * size, 413,
                        f"request body of {size} bytes exceeds the limit of "
                        f"{MAX_REQUEST_BYTES} bytes")
    if kind == "claimed":  # a Content-Length far over the limit, and no body at all
        size = draw(st.integers(8 * MAX_REQUEST_BYTES + 1, 10 ** 18))
        raw = (f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n").encode()
        return RestCase("huge_body", "POST", PREDICT, None, 413,
                        f"request body of {size} bytes exceeds the limit", raw=raw)
    if kind == "bad_length":
        value = draw(st.one_of(st.integers(max_value=-1).map(str),
                               st.text(alphabet="abcxyz.+- ", min_size=1, max_size=10)))
        try:
            assume(int(value) < 0)
        except ValueError:
            pass
        raw = (f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: {value}\r\n\r\n"
               ).encode()
        return RestCase("huge_body", "POST", PREDICT, None, 400, "bad Content-Length", raw=raw)
    if kind == "chunked":
        raw = (f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               "5\r\nhello\r\n0\r\n\r\n").encode()
        return RestCase("huge_body", "POST", PREDICT, None, 411, "chunked request bodies",
                        raw=raw)
    raw = f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    return RestCase("huge_body", "POST", PREDICT, None, 411, "Content-Length required", raw=raw)


@st.composite
def bad_url(draw):
    kind = draw(st.sampled_from(["model_status", "model_predict", "version", "huge_version",
                                 "label", "traversal", "not_v1", "malformed"]))
    name = draw(st.one_of(st.sampled_from(PATH_NAMES), st.text(min_size=1, max_size=30)))
    quoted = quote(name, safe="")
    body = json.dumps({"instances": [b64(solid_image(RED))]}).encode()
    if kind in ("model_status", "model_predict"):
        assume(name and name != "captioner")
        if kind == "model_status":
            return RestCase("bad_url", "GET", f"/v1/models/{quoted}", None, 404,
                            f"Could not find any versions of model {name}")
        return RestCase("bad_url", "POST", f"/v1/models/{quoted}:predict", body, 404,
                        f"Servable not found for request: Latest({name})")
    if kind == "version":
        version = draw(st.integers(0, 2 ** 63 - 1).filter(lambda v: v != 1))
        if draw(st.booleans()):
            return RestCase("bad_url", "GET", f"/v1/models/captioner/versions/{version}", None,
                            404, f"Could not find version {version} of model captioner")
        return RestCase("bad_url", "POST", f"/v1/models/captioner/versions/{version}:predict",
                        body, 404, f"Specific(captioner, {version})")
    if kind == "huge_version":
        version = draw(st.integers(2 ** 63, 10 ** 40))
        return RestCase("bad_url", "POST", f"/v1/models/captioner/versions/{version}:predict",
                        body, 400, f"Failed to convert version: {version} to numeric.")
    if kind == "label":
        assume(name)
        return RestCase("bad_url", "POST", f"/v1/models/captioner/labels/{quoted}:predict",
                        body, 400, f"Unrecognized servable version label: {name}")
    if kind == "traversal":  # as typed by an attacker: not re-quoted
        path, status, text = draw(st.sampled_from([
            ("/v1/models/..%2F..%2Fetc:predict", 404, "Latest(../../etc)"),
            ("/v1/models/..%2F..%2Fetc%2Fpasswd:predict", 404, "Latest(../../etc/passwd)"),
            ("/v1/models/%2e%2e:predict", 404, "Latest(..)"),
            ("/v1/models/%2Fetc%2Fpasswd", 404, "Could not find any versions of model /etc/passwd"),
            ("/v1/models/..%252F..%252Fetc:predict", 404, "Latest(..%2F..%2Fetc)"),
            ("/v1/models/%00:predict", 404, "Latest(\x00)"),
            ("/v1/models/captioner%00..%2F:predict", 404, "Latest(captioner\x00../)"),
            ("/v1/models/captioner/../../../etc/passwd", 400, "Malformed request"),
            ("/v1/models/captioner/versions/1/../../../../etc/passwd", 400, "Malformed request"),
            ("/v1/models/captioner/labels/..%2F..%2Fetc:predict", 400,
             "Unrecognized servable version label: ../../etc"),
            ("/../../etc/passwd", 404, "Not found"),
            ("/v1/../../etc/passwd", 400, "Malformed request"),
        ]))
        method = "POST" if path.endswith(":predict") else "GET"
        return RestCase("bad_url", method, path, body if method == "POST" else None, status,
                        text)
    if kind == "not_v1":
        path = "/" + quote(draw(st.text(max_size=30)), safe="/")
        # (http.server collapses leading slashes)
        assume(not ("/" + path.lstrip("/")).lower().startswith("/v1/"))
        return RestCase("bad_url", draw(st.sampled_from(["GET", "POST"])), path, b"{}", 404,
                        "Not found")
    segment = quote(draw(st.text(max_size=20)), safe="")
    method = draw(st.sampled_from(["GET", "POST"]))
    return RestCase("bad_url", method, f"/v1/bogus/{segment}", b"{}", 400,
                    f"Malformed request: {method} /v1/bogus/")


BAD_HTTP = [  # (raw request, status; "closed": no answer at all)
    (b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n", 501),
    (b"HEAD /v1/models/captioner HTTP/1.1\r\nHost: x\r\n\r\n", 501),
    (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET /v1/models/captioner HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
     431),
    (b"GET /v1/models/captioner HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 150 + b"\r\n", 431),
    # A head still incomplete past 256 KiB is refused without waiting for its end.
    (b"GET /" + b"a" * 300000, 414),
    (b"GET /v1/models/captioner HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 300000, 431),
    (b"GET /v1/models/captioner HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
    # HTTP/1.1 requires Host (RFC 9112, 3.2).
    (b"GET /v1/models/captioner HTTP/1.1\r\n\r\n", 400),
    (b"GET /v1/models/captioner HTTP/9.9\r\nHost: x\r\n\r\n", 505),
    (b"garbage\r\n\r\n", 400),
    (b"GET\r\n\r\n", 400),
    (b"GET /v1/models/captioner HTTP/1.1\r\nHost : x\r\n\r\n", 400),
    (b"GET /v1/models/captioner HTTP/1.1\r\nHost: x\r\nX:\x00y\r\n\r\n", 400),
    (b"GET /v1/models/caption\xe9r HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"\r\n", 400),
    (b"", "closed"),
]


@st.composite
def bad_http(draw):
    raw, status = draw(st.sampled_from(BAD_HTTP))
    return RestCase("bad_http", "RAW", raw[:40].decode("latin-1"), None, status, raw=raw)


REST_BUDGET = {"malformed_json": (malformed_json(), 70), "bad_base64": (bad_base64(), 60),
               "wrong_json": (wrong_json(), 90), "huge_body": (huge_body(), 50),
               "bad_url": (bad_url(), 80), "bad_http": (bad_http(), len(BAD_HTTP))}


class RestClient:
    def __init__(self, url: str):
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.host, self.port = host, int(port)

    def send(self, case: RestCase):
        """(status, JSON or text body)."""
        if case.raw is not None:
            return self._raw(case.raw)
        connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            connection.request(case.method, case.path, body=case.body)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data.decode("latin-1")

    def _raw(self, request: bytes):
        with socket.create_connection((self.host, self.port), timeout=60) as sock:
            try:
                sock.sendall(request)
                sock.shutdown(socket.SHUT_WR)
            except OSError:  # the server may answer and close before reading it all
                pass
            data = recv_until_closed(sock)
        if not data:
            return "closed", ""
        match = re.match(rb"HTTP/1\.[01] (\d{3}) ", data)
        if match:
            head, _, body = data.partition(b"\r\n\r\n")
            try:
                return int(match.group(1)), json.loads(body)
            except ValueError:
                return int(match.group(1)), body.decode("latin-1")
        code = re.search(rb"Error code: (\d{3})", data)
        return (f"html {code.group(1).decode()}" if code else "unparsed"), data.decode("latin-1")


def check_alive_rest(server, client: RestClient):
    assert server.alive(), "the server died:\n" + server.log()[-3000:]
    status, body = client.send(body_case("valid", {"instances": [b64(solid_image(GREEN))]},
                                         200, None))
    assert status == 200 and body["predictions"][0]["caption"] == expected_caption(GREEN), body


def rest_fuzz(server, budget) -> tuple:
    """Sends `budget`'s cases over REST, checking each: (counts, codes)."""
    client = RestClient(server.rest_url)
    counts, codes = collections.Counter(), collections.Counter()

    def fuzz(case):
        status, body = client.send(case)
        counts[case.category] += 1
        codes[str(status)] += 1
        assert status == case.status, f"{case!r}: got {status}: {str(body)[:500]}"
        if isinstance(body, dict) and case.text is not None:
            error = body.get("error", "")
            assert details_match(error, case.text), f"{case!r}: got {error[:500]!r}"
        elif isinstance(status, int) and status >= 400 and case.raw is None:
            assert isinstance(body, dict) and "error" in body, f"{case!r}: got {body!r}"
        if sum(counts.values()) % BATCH == 0:
            check_alive_rest(server, client)

    for strategy, examples in budget.values():
        settings(FUZZ, max_examples=examples)(given(strategy)(fuzz))()
    check_alive_rest(server, client)
    return counts, codes


def test_rest_fuzz(server):
    counts, codes = rest_fuzz(server, REST_BUDGET)
    assert_log_clean(server)
    line = summary("REST fuzz", counts, codes)
    print("\n" + line)
    assert sum(counts.values()) >= 300, line
    assert all(counts[c] >= 10 for c in ("malformed_json", "bad_base64", "wrong_json",
                                         "huge_body", "bad_url", "bad_http")), line


def test_tensor_parsing_never_raises_anything_else():
    """In-process: any shape and values give an array or TensorParseError, never a
    different exception, and never more elements than the limit (no allocation)."""
    from serving.tensors import TensorParseError, tensor_proto_to_ndarray
    checked = collections.Counter()

    @settings(FUZZ, max_examples=400)
    @given(st.sampled_from([types_pb2.DT_STRING, types_pb2.DT_FLOAT, types_pb2.DT_INT64,
                            types_pb2.DT_HALF, types_pb2.DT_COMPLEX128, types_pb2.DT_BOOL]),
           st.one_of(st.lists(st.integers(0, 5), max_size=4),
                     st.lists(st.one_of(st.integers(0, 5), int64s), max_size=70)),
           st.integers(0, 6), st.booleans())
    def parse(dtype, shape, values, unknown_rank):
        proto = tensor_pb2.TensorProto(dtype=dtype)
        proto.tensor_shape.unknown_rank = unknown_rank
        for d in shape:
            proto.tensor_shape.dim.add().size = d
        if dtype == types_pb2.DT_STRING:
            proto.string_val.extend([b"v"] * values)
        elif dtype == types_pb2.DT_COMPLEX128:
            proto.dcomplex_val.extend([1.0] * (2 * values))
        elif dtype == types_pb2.DT_HALF:
            proto.half_val.extend([1] * values)
        elif dtype == types_pb2.DT_BOOL:
            proto.bool_val.extend([True] * values)
        elif dtype == types_pb2.DT_INT64:
            proto.int64_val.extend([7] * values)
        else:
            proto.float_val.extend([1.0] * values)
        try:
            array = tensor_proto_to_ndarray(proto, max_elements=MAX_REQUEST_BYTES)
        except TensorParseError:
            checked["refused"] += 1
            return
        checked["parsed"] += 1
        assert list(array.shape) == shape and array.size <= MAX_REQUEST_BYTES

    parse()
    print(f"\ntensor parsing: {dict(checked)}")
    assert checked["refused"] > 50 and checked["parsed"] > 50


@pytest.mark.slow
def test_server_log_is_clean_and_it_stops_cleanly(model_store, serve_process,
                                                  tmp_path_factory):
    """A server of its own takes a few cases of every category: none reaches the catch-all
    handlers (unexpected exceptions), and it exits 0 on SIGTERM."""
    server = _start_server(model_store, serve_process, tmp_path_factory)
    channel = grpc.insecure_channel(server.grpc_address)
    try:
        grpc_counts, _, _, _ = grpc_fuzz(server, channel, {
            name: (strategy, SAMPLE) for name, (strategy, _) in GRPC_BUDGET.items()})
        rest_counts, _ = rest_fuzz(server, {
            name: (strategy, SAMPLE) for name, (strategy, _) in REST_BUDGET.items()})
    finally:
        channel.close()
    assert sum(grpc_counts.values()) >= len(GRPC_BUDGET), grpc_counts
    assert sum(rest_counts.values()) >= len(REST_BUDGET), rest_counts
    rss = server.rss_mb()
    assert_log_clean(server)
    assert server.stop() == 0
    print(f"\nserver RSS: {server.rss_start:.0f} MB after start, {rss:.0f} MB after "
          f"{sum(grpc_counts.values())} gRPC and {sum(rest_counts.values())} REST requests")
