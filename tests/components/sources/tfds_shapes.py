"""The synthetic shapes captions as a TensorFlow Datasets builder.

    import tests.components.sources.tfds_shapes  # registers "synthetic_shapes"
    ds = tfds.load("synthetic_shapes/small", split="train", data_dir="/tmp/tfds")

Builder configs differ only in size (`default`: 10,000 images at 64 px,
`small`: 1,000, `tiny`: 20 at 32 px, seconds to build). Splits are
contiguous blocks of the generator's stream (80 / 10 / 10 %), so each image's
pixels and captions are the same as `synthetic.generate(..., seed)` gives for
its index. Features follow the Examples artifact: ``image`` (PNG),
``image/id``, ``captions``, ``objects`` {``bbox``, ``color``, ``shape``,
``size``} (attributes as text, like the Examples artifact, so a
TFDS-sourced ExampleGen can copy them through).
"""
from __future__ import annotations

import dataclasses
import io

import tensorflow_datasets as tfds
from etils import epath

from components.synthetic import shapes as synthetic


@dataclasses.dataclass
class ShapesConfig(tfds.core.BuilderConfig):
    """Size and seed of one synthetic shapes dataset."""
    num_images: int = 10000
    image_size: int = 64
    min_objects: int = 1
    max_objects: int = 3
    captions_per_image: int = 5
    seed: int = 0
    val_fraction: float = 0.1
    test_fraction: float = 0.1


class SyntheticShapes(tfds.core.GeneratorBasedBuilder):
    """Coloured shapes on black with spatial-relation captions and boxes."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    BUILDER_CONFIGS = [
        ShapesConfig(name="default", description="10,000 images, 64 px."),
        ShapesConfig(name="small", description="1,000 images, 64 px.", num_images=1000),
        ShapesConfig(name="tiny", description="20 images, 32 px (tests).",
                     num_images=20, image_size=32),
    ]
    DEFAULT_CONFIG_NAME = "default"

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        # TFDS 4.9.10's default resolves the package through the optional
        # `importlib_resources` backport, which is not installed here.
        return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        text = tfds.features.Text()
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 3), encoding_format="png"),
                "image/id": text,
                "captions": tfds.features.Sequence(tfds.features.Text()),
                "objects": tfds.features.Sequence({
                    "bbox": tfds.features.BBoxFeature(),
                    "color": text,
                    "shape": text,
                    "size": text,
                }),
            }),
            supervised_keys=None,
            homepage="https://arxiv.org/abs/1502.03044",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        c = self.builder_config
        n_val = int(round(c.num_images * c.val_fraction))
        n_test = int(round(c.num_images * c.test_fraction))
        n_train = c.num_images - n_val - n_test
        return {
            "train": self._generate_examples(0, n_train),
            "val": self._generate_examples(n_train, n_val),
            "test": self._generate_examples(n_train + n_val, n_test),
        }

    def _generate_examples(self, start: int, count: int):
        c = self.builder_config
        for ex in synthetic.generate(count, image_size=c.image_size, min_objects=c.min_objects,
                                     max_objects=c.max_objects,
                                     captions_per_image=c.captions_per_image, seed=c.seed,
                                     start=start):
            yield ex.image_id, {
                "image": io.BytesIO(ex.image_bytes),
                "image/id": ex.image_id,
                "captions": list(ex.captions),
                "objects": {
                    "bbox": [tfds.features.BBox(*o["bbox"]) for o in ex.objects],
                    "color": [o["color"] for o in ex.objects],
                    "shape": [o["shape"] for o in ex.objects],
                    "size": [o["size"] for o in ex.objects],
                },
            }
