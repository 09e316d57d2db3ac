from tests.pipeline.fake_stages import run_evaluate as run  # noqa: F401
