"""TensorFlow Datasets source (`coco_captions` by default)."""
from __future__ import annotations

from components.contract.raw_example import RawExample


def _text_list(captions) -> tuple:
    """Caption texts from `captions` (a dict with `text`, or a plain list/tensor)."""
    import numpy as np
    if isinstance(captions, dict):
        captions = captions.get("text", [])
    values = np.asarray(captions).reshape(-1)
    return tuple(v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values)


def read_tfds(name: str, data_dir: str = "", splits: str = "train,val,test"):
    """Reads a captioning dataset from TFDS, keeping its splits.

    Images are read without decoding (`SkipDecoding`) so the original JPEG
    bytes are kept; a dataset that yields decoded images is re-encoded as PNG.

    Args:
      name: the TFDS name, e.g. `coco_captions` (prepare it with `tfds build`
        or give `data_dir` where it was prepared).
      data_dir: TFDS data folder ('' = TFDS default).
      splits: comma-separated TFDS split names; names other than train/val/test
        (`validation`, `restval`) are mapped onto them.
    Returns:
      (iterator of RawExample, None).
    """
    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds
    split_map = {"validation": "val", "restval": "train"}

    def gen():
        for split in [s.strip() for s in splits.split(",") if s.strip()]:
            ds = tfds.load(name, split=split, data_dir=data_dir or None, shuffle_files=False,
                           decoders={"image": tfds.decode.SkipDecoding()})
            for i, ex in enumerate(tfds.as_numpy(ds)):
                image = ex["image"]
                if isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3:
                    data = tf.io.encode_png(image).numpy()
                else:
                    data = bytes(image)
                image_id = ex.get("image/id", ex.get("image/filename", f"{split}-{i}"))
                if isinstance(image_id, bytes):
                    image_id = image_id.decode()
                yield RawExample(image_id=str(image_id), image_bytes=data,
                                 captions=_text_list(ex.get("captions", [])),
                                 split=split_map.get(split, split))
    return gen(), None
