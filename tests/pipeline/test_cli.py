"""`captioner` as a newcomer meets it: config errors up front, remembered configs, help, quiet."""
import argparse
import os
import subprocess
import sys

import pytest

from pipeline import cli
from pipeline import config as config_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _keep_this_process_as_it_is(monkeypatch):
    """`cli.main` here leaves the test process's logging, warnings and environment alone."""
    monkeypatch.setenv("CAPTIONER_VERBOSE", "1")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)


def _env():
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("CAPTIONER_VERBOSE", None)
    return env


def _captioner(*args, **kw):
    env = kw.pop("env", None) or _env()
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True,
                          text=True, env=env, cwd=kw.pop("cwd", REPO), timeout=120, **kw)


@pytest.mark.parametrize("overrides, message", [
    (["data.source=coco"], "data.source=coco needs data.captions_json"),
    (["data.source=coco", "data.captions_json=/nonexistent/captions.json"],
     "data.captions_json='/nonexistent/captions.json': expected a file (it does not exist)"),
    (["model.attention=sfot"], "did you mean 'soft'"),
    (['eval.thresholds={"BLEU4": 0.5}'], "did you mean 'Bleu_4'"),
    (["trian.epochs=3"], "did you mean 'train.epochs'"),
])
def test_run_reports_config_mistakes_before_anything_runs(tmp_path, overrides, message):
    root = tmp_path / "root"
    sets = [a for o in overrides for a in ("--set", o)]
    result = _captioner("run", "--config", "tiny", "--root", str(root), *sets)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("captioner: config error: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (root / "metadata.sqlite").exists()  # no execution recorded


def test_unknown_stage_gets_a_suggestion(tmp_path):
    result = _captioner("run", "--root", str(tmp_path), "--stages", "Trainr")
    assert result.returncode == 2
    assert "did you mean 'Trainer'" in result.stderr


def _run_args(root, config=None, overrides=()):
    return argparse.Namespace(root=str(root), config=config, overrides=list(overrides))


def test_root_remembers_its_config(tmp_path, capsys):
    tiny = config_lib.load_config("tiny", ["train.epochs=3"])
    config_lib.write_root_config(str(tmp_path), "tiny", ["train.epochs=3"], tiny)
    config, label, overrides = cli._resolve_run_config(_run_args(tmp_path))
    assert config == tiny and label == "tiny" and overrides == ["train.epochs=3"]
    err = capsys.readouterr().err
    assert "using config 'tiny' with --set train.epochs=3" in err
    assert config_lib.ROOT_CONFIG_FILE in err

    # More --set on top of the remembered config: used, and named as a difference.
    config, _, overrides = cli._resolve_run_config(_run_args(tmp_path, None, ["train.epochs=4"]))
    assert config.train.epochs == 4 and config.name == "tiny"
    assert overrides == ["train.epochs=3", "train.epochs=4"]
    assert "differs" in capsys.readouterr().err

    # Another --config: used, with the keys that differ.
    config, label, _ = cli._resolve_run_config(_run_args(tmp_path, "demo"))
    assert label == "demo" and config.name == "demo"
    err = capsys.readouterr().err
    assert "differs from the one" in err and "'tiny'" in err
    assert "name: tiny -> demo" in err and "train.epochs: 3 -> " in err


def test_run_without_config_or_record_uses_demo(tmp_path, capsys):
    config, label, _ = cli._resolve_run_config(_run_args(tmp_path))
    assert label == "demo" and config.name == "demo"
    assert capsys.readouterr().err == ""


def test_unreadable_root_config_is_a_config_error(tmp_path):
    (tmp_path / config_lib.ROOT_CONFIG_FILE).write_text("{not json")
    with pytest.raises(config_lib.ConfigError, match="pass --config"):
        cli._resolve_run_config(_run_args(tmp_path))


@pytest.mark.parametrize("command, default", [
    ("run", "(default: pipeline_root)"), ("inspect", "(default: pipeline_root)"),
    ("config", "(default: demo)"), ("tensorboard", "(default: 6006)")])
def test_help_shows_defaults(command, default, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    assert default in " ".join(capsys.readouterr().out.split())


def test_help_does_not_import_tensorflow():
    code = ("import sys\nfrom pipeline import cli\ntry:\n    cli.main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('tensorflow', 'keras', 'apache_beam', 'grpc') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=_env(), cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert "tensorboard" in result.stdout and "caption" in result.stdout


def test_closed_pipe_ends_quietly():
    env = _env()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "config", "--reference"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    proc.stdout.close()  # the reader leaves before the first line (`| head -0`)
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141


def test_tensorboard_finds_the_trainers_logs(tmp_path, capsys):
    published = tmp_path / "Trainer" / "4" / "model" / "logs"
    (published / "train").mkdir(parents=True)
    (published / "train" / "events.out.tfevents.1.host").write_bytes(b"")
    # The work folder it was published from holds the same file: not listed twice.
    work = tmp_path / "Trainer" / ".work" / "abc" / "logs"
    work.mkdir(parents=True)
    (work / "events.out.tfevents.1.host").write_bytes(b"")
    assert cli.tensorboard_logdirs(str(tmp_path)) == [("Trainer/4", str(published))]
    assert cli.main(["tensorboard", "--root", str(tmp_path), "--print-only"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"tensorboard --logdir_spec=Trainer/4:{published} --port 6006")


def test_tensorboard_without_logs_says_what_to_run(tmp_path, capsys):
    assert cli.main(["tensorboard", "--root", str(tmp_path)]) == 1
    assert "run the EncoderTrainer or the Trainer first" in capsys.readouterr().err


def test_tensorboard_help_says_what_it_shows(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tensorboard", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("EncoderTrainer", "encoder/val_map", "train/*", "scst/*",
                  "<Stage>/<execution id>", "<Stage>/running-<fp>", "<Stage>/unpublished-<fp>"):
        assert shown in text, shown


def test_tensorboard_is_installed_and_reads_the_printed_spec(tmp_path, capsys):
    from tensorboard.backend.event_processing import data_ingester
    logs = tmp_path / "EncoderTrainer" / "2" / "encoder" / "logs"
    logs.mkdir(parents=True)
    (logs / "events.out.tfevents.1.host").write_bytes(b"")
    assert cli.main(["tensorboard", "--root", str(tmp_path), "--print-only"]) == 0
    spec = capsys.readouterr().out.split()[1].removeprefix("--logdir_spec=")
    assert data_ingester._parse_event_files_spec(spec) == {
        os.path.realpath(logs): "EncoderTrainer/2"}


def test_default_log_is_quiet(tmp_path):
    # ExampleGen imports TensorFlow: only the stage's own lines and its bar may show.
    result = _captioner("run", "--config", "tiny", "--root", str(tmp_path), "--stages",
                        "ExampleGen", "--set", "data.num_images=12")
    assert result.returncode == 0, result.stderr
    lines = [l.strip() for l in result.stderr.replace("\r", "\n").splitlines() if l.strip()]
    noise = [l for l in lines if not l.startswith(("[ExampleGen]", "ExampleGen:"))]
    assert noise == [], result.stderr
    assert "[ExampleGen] done" in result.stderr

    # The root remembers the config: a later run without --config says which it uses.
    again = _captioner("run", "--root", str(tmp_path), "--stages", "ExampleGen")
    assert again.returncode == 0, again.stderr
    assert "using config 'tiny' with --set data.num_images=12" in again.stderr
    assert "[ExampleGen] cached" in again.stderr


def test_verbose_shows_the_library_logs(tmp_path):
    result = _captioner("run", "--config", "tiny", "--root", str(tmp_path), "--stages",
                        "ExampleGen", "--set", "data.num_images=12", "--verbose",
                        env=dict(_env(), TF_CPP_MIN_LOG_LEVEL="0"))
    assert result.returncode == 0, result.stderr
    assert "[ExampleGen] done" in result.stderr
    lines = [l for l in result.stderr.replace("\r", "\n").splitlines() if l.strip()]
    assert [l for l in lines if not l.startswith(("[ExampleGen]", "ExampleGen:"))]


def test_caption_loads_the_protos_without_tensorflow():
    code = ("import sys\nfrom pipeline import cli\ntry:\n    cli.main(['caption', '--help'])\n"
            "except SystemExit:\n    pass\n"
            "print('tensorflow' in sys.modules, 'serving.client.caption_client' in sys.modules)\n"
            "import tensorflow as tf\n"  # a later import still gets the real package
            "print(int(tf.constant(1) + 1))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=_env(), cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["False True", "2"]


def test_loading_the_cli_and_its_config_imports_neither_numpy_nor_tensorflow():
    # Every `captioner` command loads the config: the declarations it is
    # generated from (serving's options, the export's decoding, the decoder's
    # options) must stay light.
    code = ("import sys\nimport pipeline.cli\nfrom pipeline import config\n"
            "config.load_config('demo')\n"
            "print(sorted(m for m in ('numpy', 'tensorflow', 'grpc') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=_env(), cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"
