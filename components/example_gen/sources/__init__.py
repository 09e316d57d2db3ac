"""Data sources for ExampleGen: each returns (iterator of RawExample, total or None)."""
from __future__ import annotations

from typing import Callable

from components.contract.config import BOXED_SOURCES, INSTANCE_SOURCES


def _synthetic(cfg):
    from components.synthetic import shapes as synthetic
    return (synthetic.generate(cfg.num_images, image_size=cfg.image_size,
                               min_objects=cfg.min_objects, max_objects=cfg.max_objects,
                               captions_per_image=cfg.captions_per_image, seed=cfg.seed),
            cfg.num_images)


def _scenes(cfg):
    from components.synthetic import scenes
    return (scenes.generate(cfg.num_images, image_size=cfg.image_size,
                            min_objects=cfg.min_objects, max_objects=cfg.max_objects,
                            captions_per_image=cfg.captions_per_image, seed=cfg.seed),
            cfg.num_images)


def _coco(cfg):
    from components.example_gen.sources import coco
    return _with_instances(coco.read_coco(cfg.captions_json, cfg.images_dir), cfg)


def _karpathy(cfg):
    from components.example_gen.sources import karpathy
    return _with_instances(karpathy.read_karpathy(cfg.captions_json, cfg.images_dir), cfg)


def _with_instances(source, cfg):
    """A COCO-format source's examples with their `data.instances_json` boxes, if set."""
    if not cfg.instances_json:
        return source
    import dataclasses
    import sys

    from components.example_gen.sources.instances import read_instances
    records, total = source
    instances = read_instances(cfg.instances_json)
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(instances.skipped.items()))
    print(f"[ExampleGen] {cfg.instances_json}: boxes for {len(instances.objects)} images"
          + (f"; annotations skipped: {skipped}" if skipped else ""), file=sys.stderr)
    return (dataclasses.replace(raw, objects=instances.of(raw.image_id)) for raw in records), total


def _tfds(cfg):
    from components.example_gen.sources import tfds_source
    return tfds_source.read_tfds(cfg.tfds_name, cfg.tfds_data_dir, cfg.tfds_splits)


SOURCES: dict[str, Callable] = {"synthetic": _synthetic, "scenes": _scenes, "coco": _coco,
                                "karpathy": _karpathy, "tfds": _tfds}


def get_source(name: str) -> Callable:
    """The reader for `data.source`."""
    if name not in SOURCES:
        raise ValueError(f"unknown data.source {name!r}; choose one of {', '.join(SOURCES)}")
    return SOURCES[name]


def has_boxes(name: str, instances_json: str = "") -> bool:
    """Whether the examples of `data.source` carry object boxes.

    Args:
      name: `data.source`.
      instances_json: `data.instances_json`: COCO instance boxes for the
        coco and karpathy sources.
    """
    return name in BOXED_SOURCES or (name in INSTANCE_SOURCES and bool(instances_json))
