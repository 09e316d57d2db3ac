"""What the stages share: the contract between them and with the runner.

Stages never import each other; they agree through this package only:

| module | holds |
|---|---|
| `config/` | the config dataclasses, allowed values, validation, overrides; `DeclaredConfig` |
| `config_paths` | the config keys that name files or folders, and their checks |
| `artifacts` | artifact folders, `artifact.json`, root-relative URIs |
| `artifact_layouts` | the file layout of each artifact type (docs/ARTIFACTS.md) |
| `schema` | the record formats (`tf.train.Example` features) and file names |
| `io_utils` | reading and writing the records, dead letters, atomic files |
| `raw_example` | the record a data source yields to ExampleGen |
| `object_words` | which caption words name an object (COCO categories, synthetic attributes); each word's role in a synthetic object phrase |
| `precision` | the mixed-precision policy of the training stages |
| `summary_writer` | TensorBoard scalars, written by the training stages |
| `export_model` | a Model as a TF Serving SavedModel (the Exporter's output, re-made by |
|  | the Evaluator for a baseline) |
| `scoring` | how captions are scored: the empty-caption placeholder |
| `stage_log` | the stages' `[<Stage>] ...` progress lines |
| `quiet` | the quiet start-up of `captioner` and of the processes a stage starts |
"""
