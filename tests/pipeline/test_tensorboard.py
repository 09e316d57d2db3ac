"""`captioner tensorboard`: published and running training stages, each shown once."""
import os

import pytest

from pipeline import cli
from pipeline.metadata import MetadataStore

FP_RUNNING = "a" * 64
FP_PUBLISHED = "b" * 64
FP_STOPPED = "c" * 64


def _events(folder, *names):
    os.makedirs(folder, exist_ok=True)
    for name in names:
        with open(os.path.join(folder, f"events.out.tfevents.{name}"), "wb"):
            pass


def _work(root, stage, fp):
    return os.path.join(root, stage, ".work", fp[:16], "logs")


@pytest.fixture
def root(tmp_path):
    """Execution 4 published its Trainer logs; execution 7 trains now; one stopped unpublished."""
    root = str(tmp_path)
    published = os.path.join(root, "Trainer", "4", "model", "logs")
    _events(published, "1.host.10.v2")
    _events(os.path.join(published, "scst"), "2.host.10.v2")
    # The work folder that execution 4 published from: the same event files.
    _events(_work(root, "Trainer", FP_PUBLISHED), "1.host.10.v2")
    _events(os.path.join(_work(root, "Trainer", FP_PUBLISHED), "scst"), "2.host.10.v2")
    _events(_work(root, "Trainer", FP_RUNNING), "3.host.11.v2")
    _events(_work(root, "Trainer", FP_STOPPED), "4.host.12.v2")
    os.makedirs(_work(root, "Trainer", "d" * 64))                       # nothing logged yet
    os.makedirs(os.path.join(root, "Trainer", ".tmp-9", "model"))       # being published
    _events(os.path.join(root, "EncoderTrainer", "2", "encoder", "logs"), "5.host.13.v2")
    store = MetadataStore(os.path.join(root, "metadata.sqlite"))
    store.begin_execution("Trainer", FP_RUNNING, {})
    store.begin_execution("EncoderTrainer", FP_STOPPED, {})             # another stage's
    yield root
    store.close()


def test_lists_published_then_running_then_unpublished_logs_once(root):
    assert cli.tensorboard_logdirs(root) == [
        ("EncoderTrainer/2", os.path.join(root, "EncoderTrainer", "2", "encoder", "logs")),
        ("Trainer/4", os.path.join(root, "Trainer", "4", "model", "logs")),
        (f"Trainer/running-{FP_RUNNING[:8]}", _work(root, "Trainer", FP_RUNNING)),
        (f"Trainer/unpublished-{FP_STOPPED[:8]}", _work(root, "Trainer", FP_STOPPED)),
    ]


def test_a_work_folder_with_curves_not_yet_published_is_shown(root):
    # A re-run from the same work folder adds an event file: not published yet.
    _events(_work(root, "Trainer", FP_PUBLISHED), "6.host.14.v2")
    names = [name for name, _ in cli.tensorboard_logdirs(root)]
    assert f"Trainer/unpublished-{FP_PUBLISHED[:8]}" in names


def test_print_only_names_every_logdir_in_tensorboards_spec_format(root, capsys):
    from tensorboard.backend.event_processing import data_ingester
    assert cli.main(["tensorboard", "--root", root, "--print-only"]) == 0
    command = capsys.readouterr().out.split()
    assert command[0] == "tensorboard" and command[2:] == ["--port", "6006",
                                                          "--host", "127.0.0.1"]
    spec = command[1].removeprefix("--logdir_spec=")
    # The installed TensorBoard reads the spec back as (folder -> run name).
    parsed = data_ingester._parse_event_files_spec(spec)
    assert parsed == {os.path.realpath(path): name
                      for name, path in cli.tensorboard_logdirs(root)}


def test_a_running_encoder_trainers_epochs_are_visible_while_it_trains(tmp_path):
    """The EncoderTrainer's work-folder logs show each finished epoch before the stage ends."""
    from components import encoder_trainer
    from components.example_gen import stage as example_gen
    from components.synthetic.shapes import generate
    from pipeline.config import DataConfig, EncoderConfig
    from tests.components.test_encoder_trainer import _scalars

    root = str(tmp_path / "root")
    data = DataConfig(num_images=60, image_size=32, val_fraction=0.2, test_fraction=0.0,
                      seed=3, num_shards=1)
    examples = str(tmp_path / "examples")
    example_gen.write_examples(generate(60, image_size=32, seed=3), examples, data)
    os.makedirs(root)
    store = MetadataStore(os.path.join(root, "metadata.sqlite"))
    store.begin_execution("EncoderTrainer", FP_RUNNING, {})
    logs = _work(root, "EncoderTrainer", FP_RUNNING)
    seen = []

    def log(line):
        # The third epoch's line: two epochs are over, the stage is still running.
        if "epoch 3:" in line:
            seen.append((cli.tensorboard_logdirs(root), _scalars(logs)))

    cfg = EncoderConfig(image_size=32, width=4, grid_size=4, max_epochs=3, patience=5,
                        batch_size=16, shuffle_buffer=8, val_images=5)
    encoder_trainer.train_from_examples(examples, cfg, log=log, logs_dir=logs)
    store.close()
    (logdirs, scalars), = seen
    assert logdirs == [(f"EncoderTrainer/running-{FP_RUNNING[:8]}", logs)]
    assert [step for step, _ in scalars["encoder/loss"]] == [1, 2]
    assert [step for step, _ in scalars["encoder/val_map"]] == [1, 2]
