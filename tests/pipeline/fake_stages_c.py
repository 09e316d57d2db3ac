from tests.pipeline.fake_stages import run_c as run  # noqa: F401
