from tests.pipeline.fake_stages import run_a as run  # noqa: F401
