"""Model versions: which SavedModel versions are served, loaded, batched and retired.

The model folder layout and `models.config` (`model_config`), the version
manager that polls, loads, warms up and unloads (`model_manager`), one
loaded version (`servable`) and its dynamic batching (`batch_scheduler`,
`batching_parameters`). Imports `serving.limits` and `serving.errors`.
"""
