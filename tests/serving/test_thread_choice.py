"""`captioner serve`'s intra-op pool size when `--tensorflow_intra_op_parallelism` is unset."""
import json
import os

import pytest

from serving.server.thread_choice import (
    SMALL_ENCODER_GFLOPS,
    choose_intra_op,
    newest_encoder_gflops,
)
from serving.signature.export import EXPORT_RECORD
from tests.serving.conftest import fresh_process_words


def _version(base, version, gflops=None, record=True, saved_model=True):
    """A version folder: a stand-in saved_model.pb and an export record with `gflops`."""
    folder = base / str(version)
    os.makedirs(folder / "assets.extra")
    if saved_model:
        (folder / "saved_model.pb").write_bytes(b"")
    if record:
        fields = {"model": "fp"} if gflops is None else {"encoder_gflops": gflops}
        (folder / EXPORT_RECORD).write_text(json.dumps(fields))
    return folder


def test_a_flag_given_wins_even_zero(tmp_path):
    _version(tmp_path, 1, gflops=0.07)
    assert choose_intra_op(0, [str(tmp_path)]).intra_op == 0  # TensorFlow's choice, as asked
    assert choose_intra_op(4, [str(tmp_path)]).intra_op == 4


def test_small_encoders_get_one_thread_per_op_and_large_ones_tensorflows_pools(tmp_path):
    small, large = tmp_path / "small", tmp_path / "large"
    _version(small, 1, gflops=0.067)   # the demo's small CNN
    _version(large, 3, gflops=7.75)    # ResNet50 at 224 x 224
    assert choose_intra_op(None, [str(small)]).intra_op == 1
    assert choose_intra_op(None, [str(large)]).intra_op == 0
    both = choose_intra_op(None, [str(small), str(large)])  # the largest decides
    assert both.intra_op == 0 and "7.75" in both.reason
    edge = tmp_path / "edge"
    _version(edge, 1, gflops=SMALL_ENCODER_GFLOPS)
    assert choose_intra_op(None, [str(edge)]).intra_op == 1


def test_the_newest_version_decides(tmp_path):
    _version(tmp_path, 2, gflops=0.05)
    _version(tmp_path, 10, gflops=12.0)  # 10 > 2: numbers, not names, order versions
    _version(tmp_path, 11, gflops=0.05, saved_model=False)  # not a version yet
    os.makedirs(tmp_path / ".12")  # hidden: a copy under way
    assert newest_encoder_gflops(str(tmp_path)) == 12.0
    assert choose_intra_op(None, [str(tmp_path)]).intra_op == 0


@pytest.mark.parametrize("case", ["no record", "record without the cost", "bad json",
                                  "negative", "not a number", "no versions", "no folder"])
def test_an_unknown_cost_keeps_tensorflows_choice(tmp_path, case):
    base = tmp_path / "captioner"
    base.mkdir()
    if case == "no record":
        _version(base, 1, record=False)
    elif case == "record without the cost":
        _version(base, 1)
    elif case in ("bad json", "negative", "not a number"):
        folder = _version(base, 1, gflops=0.07)
        text = {"bad json": "{", "negative": '{"encoder_gflops": -1}',
                "not a number": '{"encoder_gflops": "small"}'}[case]
        (folder / EXPORT_RECORD).write_text(text)
    elif case == "no folder":
        base = tmp_path / "missing"
    choice = choose_intra_op(None, [str(base)])
    assert choice.intra_op == 0 and str(base) in choice.reason
    assert choose_intra_op(None, []).intra_op == 0


def test_the_server_reads_the_cost_before_tensorflow_starts_and_sets_one_thread(tmp_path):
    """In a fresh process, as `main` runs it: base paths from a models.config, the record
    read without starting TensorFlow's runtime, then the pools sized to one thread."""
    base = tmp_path / "captioner"
    _version(base, 1, gflops=0.067)
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "captioner" base_path: "captioner" '
                      'model_platform: "tensorflow" } }')
    code = (
        "import argparse\n"
        "import tensorflow as tf\n"
        "from tensorflow.python.eager import context\n"
        "from serving.server.model_server import _model_base_paths, _set_tf_threads\n"
        "from serving.server.thread_choice import choose_intra_op\n"
        f"args = argparse.Namespace(model_base_path=None, model_config_file={str(config)!r})\n"
        "paths = _model_base_paths(args)\n"
        "choice = choose_intra_op(None, paths)\n"
        "started = context.context()._context_handle is not None\n"
        "_set_tf_threads(choice.intra_op, 0)\n"
        "tf.constant(1.0) + 1.0\n"
        "print(len(paths), started, choice.intra_op, "
        "tf.config.threading.get_intra_op_parallelism_threads())\n")
    assert fresh_process_words(code)[-4:] == ["1", "False", "1", "1"]


def test_the_flag_is_unset_by_default_and_zero_when_given_zero():
    from serving.server.flags import build_parser
    parser = build_parser()
    assert parser.parse_args(["--model-base-path", "m"]).intra_op is None
    assert parser.parse_args(["--model-base-path", "m",
                              "--tensorflow_intra_op_parallelism=0"]).intra_op == 0
