"""ExampleGen: a data source -> `Examples` (TFRecords per split, split by image).

| module | job |
|---|---|
| `stage` | the stage entry `run(ctx)`: validate every input, split, write, dead letters |
| `sources` | the readers of `data.source`: synthetic, scenes, coco, karpathy, tfds |
"""
from components.example_gen.stage import run

__all__ = ["run"]
