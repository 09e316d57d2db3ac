"""benchmarks/scale.py: its overrides are valid config, RSS of a process tree, the summary."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline import config as config_lib
from tests.benchmarks import ROOT, load_benchmark


@pytest.fixture(scope="module")
def scale():
    return load_benchmark("scale")


def test_overrides_give_paper_shaped_grids_and_budgeted_training(scale):
    sets = scale.stage_overrides(1000, ["train.batch_size=8"], encoder_train=False)
    config = config_lib.load_config("tiny", sets)
    assert config.data.num_images == 1000
    enc = config.encoder
    assert (enc.image_size, enc.grid_size, enc.width, enc.coord_channels, enc.train) == (
        56, 14, 128, False, False)
    # The Trainer runs as users get it: caches while the split fits the budget, then streams.
    assert config.train.epochs == 1 and config.train.cache == "auto"
    assert not any(s.startswith("train.cache") for s in sets)
    assert config.train.batch_size == 8  # the user's override comes last
    trained = config_lib.load_config("tiny", scale.stage_overrides(10, [], encoder_train=True))
    assert trained.encoder.train and trained.encoder.max_epochs == 1


def test_tree_rss_counts_children(scale):
    # A parent that starts a child holding ~200 MB.
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', "
            "'import time; b = bytearray(200 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); "
            "time.sleep(30)']); time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        import time
        deadline = time.time() + 20
        rss = 0
        while time.time() < deadline and rss < 200 * 2 ** 20:
            time.sleep(0.2)
            rss = scale.tree_rss(parent.pid)
        assert rss >= 200 * 2 ** 20
    finally:
        import psutil
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()
    assert scale.tree_rss(parent.pid) == 0


def test_run_measured_peak_and_failure(scale, tmp_path):
    env = dict(os.environ)
    code = ("import time; b = bytearray(150 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
            "time.sleep(1.0)")
    run = scale.run_measured([sys.executable, "-c", code], env, str(tmp_path / "a.log"), 0.05)
    assert run["peak_rss"] >= 150 * 2 ** 20
    assert run["wall_s"] >= 1.0 and run["timeline"]
    with pytest.raises(RuntimeError, match="boom"):
        scale.run_measured([sys.executable, "-c", "raise SystemExit('boom')"], env,
                           str(tmp_path / "b.log"), 0.05)


def test_summary_growth_is_the_largest_over_stages(scale):
    results = {"A": {"peak_rss_mb": [100.0, 110.0], "s_per_image": [0.02, 0.01]},
               "B": {"peak_rss_mb": [200.0, 300.0], "s_per_image": [0.01, 0.012]}}
    summary = scale.summarize([1000, 16000], results)
    assert summary["memory_growth"] == 1.5 and summary["time_growth"] == 1.2
    assert summary["sizes"] == [1000, 16000] and summary["stages"] is results
    json.dumps(summary)


@pytest.mark.slow
def test_runs_a_stage_and_ends_with_the_json_line(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "scale.py"), "--sizes", "12,24",
         "--stages", "ExampleGen", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["sizes"] == [12, 24]
    stage = summary["stages"]["ExampleGen"]
    assert len(stage["peak_rss_mb"]) == 2 and all(v > 50 for v in stage["peak_rss_mb"])
    assert all(v > 0 for v in stage["s_per_image"] + stage["artifact_bytes_per_image"])
    assert summary["memory_growth"] > 0 and summary["time_growth"] > 0
    assert not os.path.exists(tmp_path / "n12")  # roots are removed unless --keep
