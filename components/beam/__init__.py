"""Apache Beam pieces shared by the Beam jobs (Preprocess, bulk captioning).

| module | job |
|---|---|
| `beam_utils` | runner options (direct, portable, dask, ...), the Keras `ModelHandler`, sharded TFRecord writes, counters, progress |
| `dask_runner` | `DaskRunner`: Beam's DaskRunner with the fixes the project needs (outputs of `finish_bundle`, tagged outputs, every sink run, side inputs computed once, metrics) |
| `dask_cluster` | the Dask cluster of a run: connect to `--dask_client_address` or start a local one, check the workers |
| `record_guard` | records in = records written + dead letters, counted from the files |
"""
