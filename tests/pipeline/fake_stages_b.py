from tests.pipeline.fake_stages import run_b as run  # noqa: F401
