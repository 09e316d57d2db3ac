"""Peak memory of decoding one image in the serving graph, per format (admission estimates).

Runs `tf.io.decode_image` + float cast + resize (what the serving graph does
per image) on one SIDE x SIDE image of random pixels, in this process, and
prints the peak RSS (VmHWM) above the warm process in bytes per decoded
pixel. `gif-frame` is a GIF whose header claims a 1x1 screen while its frame
is SIDE x SIDE. `serving/limits/admission.py`'s DECODE_BYTES_PER_PIXEL must stay
above every figure; docs/RELIABILITY.md quotes them.

    python benchmarks/decode_memory.py png 3000
    for k in png png16 jpeg pjpeg cmyk-jpeg bmp gif gif-frame; do python benchmarks/decode_memory.py $k 3000; done
"""
from __future__ import annotations

import io
import os
import struct
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.results import write_result  # noqa: E402


def encode(kind: str, side: int) -> bytes:
    pixels = (np.random.RandomState(0).rand(side, side, 3) * 255).astype("uint8")
    image, out = Image.fromarray(pixels), io.BytesIO()
    if kind in ("gif", "gif-frame"):
        image.convert("P").save(out, format="GIF")
        data = bytearray(out.getvalue())
        if kind == "gif-frame":
            data[6:10] = struct.pack("<HH", 1, 1)
        return bytes(data)
    if kind == "png16":  # 16 bits per sample (grayscale)
        Image.fromarray((pixels[:, :, 0].astype("uint16") * 257)).save(out, format="PNG")
        return out.getvalue()
    if kind == "cmyk-jpeg":
        image.convert("CMYK").save(out, format="JPEG")
        return out.getvalue()
    fmt = {"png": "PNG", "jpeg": "JPEG", "pjpeg": "JPEG", "bmp": "BMP"}[kind]
    image.save(out, format=fmt, **({"progressive": True} if kind == "pjpeg" else {}))
    return out.getvalue()


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def main() -> None:
    kind, side = sys.argv[1], int(sys.argv[2])
    data = encode(kind, side)
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(images):
        def one(image):
            decoded = tf.io.decode_image(image, channels=3, expand_animations=False)
            decoded.set_shape([None, None, 3])
            return tf.image.resize(tf.cast(decoded, tf.float32), [12, 12])
        return tf.map_fn(one, images, fn_output_signature=tf.TensorSpec([12, 12, 3], tf.float32))

    small = io.BytesIO()
    Image.new("RGB", (2, 2)).save(small, format="PNG")
    serve(tf.constant([small.getvalue()]))  # warm: trace and first allocations
    base = peak_mb()
    serve(tf.constant([data]))
    delta = peak_mb() - base
    per_pixel = delta * 2 ** 20 / side / side
    print(f"{kind} {side}x{side}: {len(data)} bytes encoded, peak +{delta:.0f} MB, "
          f"{per_pixel:.1f} bytes per pixel")
    write_result("decode_memory", {"kind": kind, "side": side, "encoded_bytes": len(data),
                                   "peak_mb": round(delta, 1),
                                   "bytes_per_pixel": round(per_pixel, 1)}, variant=kind)


if __name__ == "__main__":
    main()
