"""`captioner serve --config NAME`: the config's serve section becomes serve flags."""
from __future__ import annotations

import dataclasses

import pytest

from pipeline import config as config_lib
from pipeline.cli import SERVE_FLAGS, serve_argv
from serving.server.flags import DEFAULTS, build_parser


def test_serve_config_defaults_equal_the_server_defaults():
    serve = config_lib.ServeConfig()
    for field in dataclasses.fields(serve):
        assert getattr(serve, field.name) == getattr(DEFAULTS, field.name), field.name
    assert set(SERVE_FLAGS) == {f.name for f in dataclasses.fields(serve)}


def test_config_section_becomes_flags_and_the_command_line_wins():
    argv = serve_argv(["--config", "demo", "--set", "serve.port=9100",
                       "--set=serve.max_image_pixels=1000", "--model_base_path=/m",
                       "--rest-port", "9101"])
    args = build_parser().parse_args(argv)
    assert args.port == 9100 and args.max_image_pixels == 1000
    assert args.rest_port == 9101  # given on the command line, after the config's flags
    assert args.model_base_path == "/m"
    assert args.host == config_lib.ServeConfig().host


def test_without_config_the_line_is_unchanged():
    line = ["--model_base_path=/m", "--port=0"]
    assert serve_argv(line) == line


def test_unknown_serve_keys_are_config_errors():
    with pytest.raises(config_lib.ConfigError):
        serve_argv(["--config", "demo", "--set", "serve.no_such_key=1"])
