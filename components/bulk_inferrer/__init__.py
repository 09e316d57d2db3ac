"""Bulk captioning (TFX's BulkInferrer): a captioner SavedModel over many images, no server.

`captioner caption --model PATH IMAGE...` runs it; docs/serving.md, "Bulk captioning".

| module | job |
|---|---|
| `cli` | the command line: `main(argv)` |
| `inputs` | the driver's inputs: the version folder, the image paths, a temp folder |
| `job` | the Beam job (read, `RunInference`, JSON lines) and its driver `run_bulk_inference` |
"""
