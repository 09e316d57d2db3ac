"""Evaluator: ServingModel + Examples (test split) -> `Evaluation`, `Blessing`.

| module | job |
|---|---|
| `stage` | the stage entry `run(ctx)`: caption the test split through the export, score, bless |
| `split_readers` | the test split's image bytes and references from the Examples |
| `metrics/` | COCO metrics (and `java`: the Java runtime their jars run on), caption endings, grounding, the paired bootstrap, the blessing rule |
| `figures` | the attention figures written into the Evaluation |
"""
from components.evaluator.stage import run

__all__ = ["run"]
