"""How much of SCST's validation CIDEr gain holds on other images.

    python benchmarks/scst_selection.py --root R/soft-seed5/plain+scst_size_reward=0 \
        --root R/soft-seed5/plain+scst_box_attention=0.3+scst_size_reward=0.5

The SCST phase keeps the epoch with the best greedy CIDEr on the first
`train.val_examples` validation images (docs/scst.md, "Guard rails"), so
the gain it logs is measured on the images that chose the model. For each
root (a run whose Trainer ran SCST) this decodes greedily, in float32, with
the Trainer's own validator (`components/trainer/validation.py`), both the
start model and the exported SCST model on:

- `selection`: the validation images the SCST stop read;
- `val_rest`: the other validation images;
- `test`: the whole test split;

and scores each set with CIDEr (coco-caption, the set's own document
frequencies, as the Trainer scores them). `subsets` draws `--draws` random
test subsets of the selection's size (without replacement) and gives the
spread of the gain there: how far one set of that size strays by chance.

Prints one JSON line per root and records everything with
`write_result("scst_selection", ...)`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.results import artifact_properties, stage_outputs, write_result  # noqa: E402
from benchmarks.train_step import cpu_has_bf16, cpu_model  # noqa: E402


def cider(references: Sequence[Sequence[str]], captions: Sequence[str],
          rows: Sequence[int]) -> float:
    """coco-caption CIDEr of `captions[rows]` against `references[rows]` (their own df)."""
    from pycocoevalcap.cider.cider import Cider

    from components.contract.scoring import nonempty
    gts = {i: list(references[i]) for i in rows}
    res = {i: [nonempty(captions[i])] for i in rows}
    return float(Cider().compute_score(gts, res)[0])


def gains(references, start: Sequence[str], tuned: Sequence[str], sets: dict) -> dict:
    """Per named set of rows: the start's and the tuned model's CIDEr and the relative gain."""
    out = {}
    for name, rows in sets.items():
        if len(rows) == 0:
            continue
        a, b = cider(references, start, rows), cider(references, tuned, rows)
        out[name] = {"images": len(rows), "start": round(a, 4), "scst": round(b, 4),
                     "gain": round(b / a - 1, 4) if a else None}
    return out


def subset_spread(references, start, tuned, size: int, draws: int, seed: int) -> dict:
    """The gain over `draws` random subsets of `size` rows: mean, sd, 2.5th and 97.5th pct."""
    import numpy as np
    rng = np.random.default_rng(seed)
    size = min(size, len(references))
    values = []
    for _ in range(draws):
        rows = rng.choice(len(references), size, replace=False)
        a, b = cider(references, start, rows), cider(references, tuned, rows)
        values.append(b / a - 1 if a else 0.0)
    values = np.asarray(values)
    return {"images": size, "draws": draws, "mean": round(float(values.mean()), 4),
            "sd": round(float(values.std()), 4),
            "interval": [round(float(np.percentile(values, q)), 4) for q in (2.5, 97.5)]}


def _val_examples(root: str) -> int:
    with open(os.path.join(root, "pipeline_config.json")) as f:
        return int(json.load(f)["resolved"]["train"]["val_examples"])


def measure(root: str, draws: int, seed: int) -> dict:
    """The gains of the SCST model of `<root>`'s last run over its start model."""
    import keras

    import models.show_attend_tell  # noqa: F401  (registers the layers)
    from components.contract import schema
    from components.trainer.train_data import load_eval_set
    from components.trainer.validation import Validator
    outputs = stage_outputs(root)
    model_uri = outputs["Trainer"]["model"]
    info = artifact_properties(model_uri).get("scst")
    if not info:
        raise SystemExit(f"{root}: its Trainer ran no SCST phase")
    start_file = info["start"].replace("${root}", root)
    annotations, vocabulary = (outputs["Preprocess"][k] for k in ("annotations", "vocabulary"))
    id_to_word = schema.read_vocabulary(vocabulary)
    grid = schema.annotations_grid_shape(annotations, artifact_properties(annotations))
    split = {name: load_eval_set(schema.split_files(annotations, name), grid, 10**9, id_to_word)
             for name in ("val", "test")}
    captions = {}
    for label, path in (("start", start_file), ("scst", schema.model_file(model_uri))):
        model = keras.saving.load_model(path, compile=False)
        captions[label] = {name: Validator(model, data, id_to_word).captions()
                           for name, data in split.items()}
    chosen = min(_val_examples(root), len(split["val"]))
    val_refs, test_refs = split["val"].references, split["test"].references
    out = {"root": root, "best_epoch": info.get("best_epoch"),
           "logged": {"start_cider": info.get("start_cider"), "best_cider": info.get("best_cider")}}
    out.update(gains(val_refs, captions["start"]["val"], captions["scst"]["val"],
                     {"selection": range(chosen), "val_rest": range(chosen, len(val_refs))}))
    out.update(gains(test_refs, captions["start"]["test"], captions["scst"]["test"],
                     {"test": range(len(test_refs))}))
    if test_refs and chosen:
        out["subsets"] = subset_spread(test_refs, captions["start"]["test"],
                                       captions["scst"]["test"], chosen, draws, seed)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", action="append", required=True,
                   help="a root whose last run's Trainer ran SCST (repeatable)")
    p.add_argument("--draws", type=int, default=200,
                   help="random test subsets of the selection's size (default 200)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    runs = []
    for root in args.root:
        runs.append(measure(os.path.abspath(root), args.draws, args.seed))
        print(json.dumps(runs[-1]), flush=True)
    cpu = {"cpu": cpu_model(), "native_bf16": cpu_has_bf16()}
    print(json.dumps(cpu), flush=True)
    write_result("scst_selection", {"runs": runs, "precision": "float32", **cpu}, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
