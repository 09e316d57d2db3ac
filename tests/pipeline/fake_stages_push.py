from tests.pipeline.fake_stages import run_push as run  # noqa: F401
