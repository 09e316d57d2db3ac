"""Which size words a model says, and how often they are true, before and after SCST.

    python benchmarks/scst_size_words.py --root R [--root R2 ...]

`R` is a root in which a run evaluated an SCST model against the pushed
cross-entropy model (as `benchmarks/scst_grounding.py` leaves them, e.g.
`<root>/soft-seed3/plain`). From that run's Evaluator folder it reads both
models' test captions (`captions.jsonl`, `baseline_captions.jsonl`) and from
its ExampleGen the test images' objects. Each caption is parsed with the
scenes grammar; over the object phrases that match an object of the image
(same colour and kind), it counts:

- `true_sizes`: the size of the first matched object, as a fraction of the
  matched phrases (what a caption could have said);
- `said`: per size word the phrases name, how many, and the fraction true
  (the size of a matched object: the Evaluator's `size_accuracy`, per word);
- `size_accuracy` and `phrases_per_image`.

Prints one JSON line per root and writes them with `write_result`
("scst_size_words").
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Iterable, Mapping, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.results import stage_outputs, write_result  # noqa: E402

MODELS = {"cross_entropy": "baseline_captions.jsonl", "scst": "captions.jsonl"}


def size_words(captions: Iterable[tuple[str, str]],
               objects: Mapping[str, Sequence[Mapping]]) -> dict:
    """The counts of the module docstring over `(image id, caption)` pairs."""
    from components.synthetic.scenes_grammar import parse_caption
    said, true, truth = collections.Counter(), collections.Counter(), collections.Counter()
    images = phrases = 0
    for image_id, caption in captions:
        images += 1
        for phrase in parse_caption(caption).objects:
            phrases += 1
            matched = [o for o in objects.get(image_id, ())
                       if (o.get("color"), o.get("shape")) == (phrase.color, phrase.shape)]
            if not matched:
                continue
            truth[matched[0].get("size")] += 1
            if phrase.size is not None:
                said[phrase.size] += 1
                true[phrase.size] += any(o.get("size") == phrase.size for o in matched)
    total = sum(truth.values())
    return {"images": images, "phrases_per_image": round(phrases / max(images, 1), 3),
            "matched_phrases": total,
            "true_sizes": {k: round(v / total, 3) for k, v in sorted(truth.items())},
            "said": {k: {"phrases": v, "true": round(true[k] / v, 3)}
                     for k, v in sorted(said.items())},
            "size_accuracy": (round(sum(true.values()) / sum(said.values()), 3)
                              if said else None)}


def _test_objects(examples_uri: str) -> dict:
    """image id -> its objects, from the test split of an Examples artifact."""
    import tensorflow as tf

    from components.contract import schema
    out = {}
    for record in tf.data.TFRecordDataset(schema.split_files(examples_uri, "test")):
        feature = tf.train.Example.FromString(record.numpy()).features.feature
        out[schema.example_image(feature)[0]] = schema.parse_objects(feature)
    return out


def measure(root: str) -> dict:
    """Both models' counts for the run whose summary is `<root>/run_summary.json`."""
    outputs = stage_outputs(root)
    evaluation = outputs["Evaluator"]["evaluation"]
    objects = _test_objects(outputs["ExampleGen"]["examples"])
    out = {"root": root}
    for model, name in MODELS.items():
        with open(os.path.join(evaluation, name)) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        out[model] = size_words(((r["image_id"], r["caption"]) for r in rows), objects)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", action="append", required=True,
                   help="a root whose last run evaluated an SCST model against the pushed one")
    args = p.parse_args(argv)
    results = []
    for root in args.root:
        results.append(measure(root))
        print(json.dumps(results[-1]), flush=True)
    write_result("scst_size_words", {"runs": results}, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
