"""Analysis: does a single region carry the word, and where does a model's attention go?

    python benchmarks/attention_signal.py --root demo_output/pipeline
    python benchmarks/attention_signal.py --root R --execution 8 --max-images 200

For a trained decoder of a pipeline root on the synthetic shapes data (the
latest Trainer execution, or `--execution N`), on the test split: each image's
first reference caption is teacher-forced through the model's own decoding
step (`decode_step`: the expected context, the inference rule of soft and,
by default, hard attention). At every colour, size or
shape word of an object phrase whose object has a box, the step is re-run
from the same state with each single region as the context, which is what a
hard-attention sample feeds the LSTM. Reported, averaged over those steps:

* `logp_inside` / `logp_outside`: the word's log-probability with one region
  whose centre lies inside / outside the object's box (the REINFORCE reward
  of a sample there, with `reinforce_credit=token`);
* `logp_expected`: the same with the model's inference context (for the
  expected context, the per-word baseline of `reinforce_baseline=expected`);
* `best_region_inside`: how often the best single region lies inside the box;
* `alpha_mass_inside`: the attention weight on the box's regions.

A reward that singles out the object needs `logp_inside` well above
`logp_outside`; sharp, grounded attention shows as a large `alpha_mass_inside`.
Prints one JSON line. About 1 minute on 2 CPU cores for 200 images.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.results import write_result  # noqa: E402

ARTICLES = ("a", "an", "the")


def _latest(pattern: str) -> str:
    found = sorted(glob.glob(pattern), key=lambda p: int(p.split(os.sep)[-2]))
    if not found:
        raise SystemExit(f"nothing matches {pattern}: run the pipeline on this root first")
    return found[-1]


def _box_regions(bbox, h: int, w: int) -> np.ndarray:
    """(h * w,) bool: regions whose centre lies inside the normalized box."""
    ymin, xmin, ymax, xmax = (float(v) for v in bbox)
    cy, cx = (np.arange(h) + 0.5) / h, (np.arange(w) + 0.5) / w
    inside = ((cy[:, None] >= ymin) & (cy[:, None] <= ymax)
              & (cx[None] >= xmin) & (cx[None] <= xmax))
    return inside.reshape(-1)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="pipeline root (shapes data)")
    parser.add_argument("--execution", type=int, default=None,
                        help="Trainer execution id (default: the latest)")
    parser.add_argument("--max-images", type=int, default=200)
    args = parser.parse_args(argv)

    import keras
    import tensorflow as tf

    import models.show_attend_tell  # noqa: F401  (registers the custom classes)
    from components.contract import schema
    from components.evaluator.split_readers import read_annotations
    from components.synthetic.shapes_grammar import parse_caption
    from models import text as text_lib

    trainer = (os.path.join(args.root, "Trainer", str(args.execution), "model")
               if args.execution is not None
               else _latest(os.path.join(args.root, "Trainer", "*", "model")))
    model_file = schema.model_file(trainer)
    model = keras.saving.load_model(model_file)
    annotations_dir = _latest(os.path.join(args.root, "Preprocess", "*", "annotations"))
    vocabulary_dir = _latest(os.path.join(args.root, "Preprocess", "*", "vocabulary"))
    vocab = schema.read_vocabulary(vocabulary_dir)
    index = {word: i for i, word in enumerate(vocab)}
    data = read_annotations(annotations_dir, "test", args.max_images)
    if data["annotations"] is None or not any(data["objects"]):
        raise SystemExit("the test split has no object boxes (synthetic shapes data only)")
    h, w = data["grid_shape"][:2]
    regions = h * w

    inside_lp, outside_lp, expected_lp, best_inside, mass_inside = [], [], [], [], []
    for grid, refs, objects in zip(data["annotations"], data["references"], data["objects"], strict=True):
        words = text_lib.normalize(refs[0])
        tokens = [index[text_lib.START]] + [index.get(x, index[text_lib.UNK]) for x in words]
        by_key = {(o["color"], o["shape"]): o for o in objects}
        boxes = {}
        for phrase in parse_caption(words).objects:
            obj = by_key.get((phrase.color, phrase.shape))
            for t in range(phrase.start, phrase.end) if obj is not None else ():
                if words[t] not in ARTICLES:
                    boxes[t] = obj["bbox"]
        a = tf.constant(grid.reshape(1, regions, -1), tf.float32)
        projected = model.project_annotations(a)
        state = model.initial_state(a)
        for t in range(len(words)):
            prev = tf.constant([tokens[t]])
            log_probs, alpha, next_state = model.decode_step(prev, state, a, projected)
            inside = _box_regions(boxes[t], h, w) if t in boxes else None
            if inside is not None and inside.any() and not inside.all():
                # The same step with each single region as the context (what a
                # hard sample feeds the LSTM), from the same state.
                state_h, state_c = state
                embedded = tf.repeat(model.embedding(prev), regions, 0)
                # In the model's compute dtype (bfloat16 for a mixed_bfloat16 model).
                single = tf.cast(a[0], model.compute_dtype)             # (L, D)
                if model.options.gated:
                    single = single * model.gate(state_h)
                hs, _ = model._cell(model.lstm_input(embedded) + model.lstm_context(single)
                                    + model.lstm_recurrent(state_h), tf.repeat(state_c, regions, 0))
                lp = tf.nn.log_softmax(model._logits(embedded, hs, single))[:, tokens[t + 1]]
                lp = lp.numpy()
                inside_lp.append(lp[inside].mean())
                outside_lp.append(lp[~inside].mean())
                best_inside.append(bool(inside[int(np.argmax(lp))]))
                mass_inside.append(float(alpha.numpy()[0][inside].sum()))
                expected_lp.append(float(log_probs[0, tokens[t + 1]]))
            state = next_state
    if not inside_lp:
        raise SystemExit("no object words with a box were found in the references")
    result = {"model": model_file, "attention": model.options.attention, "steps": len(inside_lp),
              "logp_inside": round(float(np.mean(inside_lp)), 4),
              "logp_outside": round(float(np.mean(outside_lp)), 4),
              "logp_expected": round(float(np.mean(expected_lp)), 4),
              "best_region_inside": round(float(np.mean(best_inside)), 4),
              "alpha_mass_inside": round(float(np.mean(mass_inside)), 4)}
    print(json.dumps(result))
    write_result("attention_signal", result, argv=argv)
    return result


if __name__ == "__main__":
    main()
