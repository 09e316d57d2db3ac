"""Bulk captioning (`captioner caption --model PATH IMAGE...`): the same lines as the server gives.

The fixture SavedModels of the serving tests (a caption from the image's
mean colour) are published into a base path; the Beam job's lines are
compared field by field with what `CaptionClient` gets from the project's
server on the same base path.
"""
from __future__ import annotations

import json
import os

import pytest

from components.bulk_inferrer import cli, inputs, job
from serving.client.caption_client import CaptionClient, CaptionError
from tests.serving.conftest import BLUE, GREEN, RED, make_base, model_store, start_server  # noqa: F401
from tests.serving.fixtures import expected_caption, solid_image

LINE_KEYS = {"image", "caption", "score", "tokens", "version"}


def _images(folder) -> tuple[list[str], str]:
    """Three PNGs and one corrupt file in `folder`: (the good paths, the corrupt one)."""
    folder.mkdir(parents=True, exist_ok=True)
    good = []
    for name, rgb in (("red", RED), ("blue", BLUE), ("green", GREEN)):
        path = folder / f"{name}.png"
        path.write_bytes(solid_image(rgb, size=32))
        good.append(str(path))
    bad = folder / "corrupt.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n but the rest is not an image")
    return good, str(bad)


def _lines(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _bulk(argv, capsys) -> tuple[int, str]:
    """(exit status, stderr) of `cli.main(argv)`."""
    status = cli.main([str(a) for a in argv])
    return status, capsys.readouterr().err


def test_direct_runner_lines_equal_the_servers_answers(make_base, start_server, tmp_path,
                                                      capsys):
    base = make_base({1: "image"})
    good, bad = _images(tmp_path / "images")
    out = tmp_path / "out" / "captions.jsonl"
    os.makedirs(out.parent)
    status, err = _bulk([*good, bad, "--model", base, "--output", out, "--json",
                         "--batch-size", 4], capsys)
    assert status == 1  # a dead letter
    assert "captioned 4 images (1 dead letters) in " in err and "img/s" in err
    lines = _lines(out)
    assert [line["image"] for line in lines] == sorted(good + [bad])  # sorted by path
    by_image = {line["image"]: line for line in lines}
    dead = by_image.pop(bad)
    assert set(dead) == {"image", "error"} and dead["error"].startswith("INVALID_ARGUMENT: ")

    server = start_server(base)
    with CaptionClient(server.grpc_address) as client:
        with pytest.raises(CaptionError):  # the server refuses the corrupt file too
            client.caption([open(bad, "rb").read()])
        for path in good:
            line = by_image[path]
            served = client.caption([open(path, "rb").read()], attention=False)[0]
            assert set(line) == LINE_KEYS
            assert line["caption"] == served["caption"]
            assert line["tokens"] == served["tokens"].tolist()
            assert line["score"] == pytest.approx(served["score"], abs=1e-5)
            assert line["version"] == served["version"] == 1
    assert by_image[good[0]]["caption"] == expected_caption(RED)
    # The temporary folder next to the output is gone.
    assert os.listdir(out.parent) == ["captions.jsonl"]


def test_folders_globs_and_the_highest_version(make_base, tmp_path, capsys):
    base = make_base({1: "square", 3: "image"})
    assert inputs.resolve_model(base) == (os.path.join(base, "3"), 3)
    assert inputs.resolve_model(os.path.join(base, "1") + "/") == (os.path.join(base, "1"), 1)
    folder, other = tmp_path / "folder", tmp_path / "other"
    (folder / "sub").mkdir(parents=True)
    other.mkdir()
    (folder / "a.png").write_bytes(solid_image(RED))
    (folder / "sub" / "b.JPG").write_bytes(solid_image(BLUE, fmt="JPEG"))
    (folder / "notes.txt").write_text("not an image")
    (other / "c.png").write_bytes(solid_image(GREEN))
    (other / "d.gif").write_bytes(solid_image(RED, fmt="GIF"))
    expected = sorted([str(folder / "a.png"), str(folder / "sub" / "b.JPG"),
                       str(other / "c.png")])
    args = [str(folder), str(other / "*.png"), str(folder / "a.png")]  # a.png twice
    assert inputs.expand_images(args) == expected

    status = cli.main([*args, "--model", base])  # no --output: stdout
    captured = capsys.readouterr()
    assert status == 0, captured.err
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["image"] for line in lines] == expected
    assert {line["version"] for line in lines} == {3}
    assert all(line["caption"].endswith(" image") for line in lines)  # version 3's noun


def test_nothing_to_caption_exits_2_with_one_line(make_base, tmp_path, capsys):
    base = make_base({1: "image"})
    (tmp_path / "empty").mkdir()
    cases = [[], [tmp_path / "missing.png"], [tmp_path / "empty"], [tmp_path / "*.jpg"]]
    for images in cases:
        status, err = _bulk([*images, "--model", base], capsys)
        assert status == 2 and err.count("\n") == 1 and err.startswith("captioner caption: ")
    (tmp_path / "red.png").write_bytes(solid_image(RED))
    status, err = _bulk([tmp_path / "red.png", "--model", tmp_path / "empty"], capsys)
    assert status == 2 and "no SavedModel there" in err and err.count("\n") == 1
    for signature, message in (("nope", "has no signature 'nope' (it has caption_annotations, "
                                        "serving_default)"),
                               ("caption_annotations", "not one tf.string tensor")):
        status, err = _bulk([tmp_path / "red.png", "--model", base, "--signature", signature],
                            capsys)
        assert status == 2 and message in err and err.count("\n") == 1


def test_a_lost_line_fails_the_job_and_writes_nothing(make_base, tmp_path, capsys,
                                                     monkeypatch):
    base = make_base({1: "image"})
    good, bad = _images(tmp_path / "images")
    process = job.ToLine.process

    def dropping(self, item):  # a runner that loses one output
        return iter(()) if item[0].endswith("blue.png") else process(self, item)

    monkeypatch.setattr(job.ToLine, "process", dropping)
    out = tmp_path / "out" / "captions.jsonl"
    os.makedirs(out.parent)
    status, err = _bulk([*good, bad, "--model", base, "--output", out], capsys)
    assert status == 1
    message = err.strip().splitlines()[-1]
    assert message.startswith("captioner caption: Bulk captioning lost records")
    assert "read 4, written 2, dead-lettered 1" in message
    assert os.listdir(out.parent) == []  # no output, and no temporary folder left


def test_a_file_gone_before_the_job_reads_it_is_a_dead_letter(make_base, tmp_path, capsys,
                                                              monkeypatch):
    base = make_base({1: "image"})
    good, _ = _images(tmp_path / "images")
    locate = inputs.read_location
    monkeypatch.setattr(inputs, "read_location",  # as if deleted after the expansion
                        lambda path: str(tmp_path / "gone.png") if path == good[0]
                        else locate(path))
    out = tmp_path / "out.jsonl"
    status, err = _bulk([*good, "--model", base, "--output", out], capsys)
    assert status == 1, err
    lines = {line["image"]: line for line in _lines(out)}
    assert set(lines) == set(good)
    assert set(lines[good[0]]) == {"image", "error"}
    assert lines[good[0]]["error"].startswith("cannot read: ")
    assert lines[good[1]]["caption"] == expected_caption(BLUE)


def test_check_lines_finds_a_line_written_twice_for_a_lost_one():
    lines = [json.dumps({"image": "a", "caption": "x"}), json.dumps({"image": "a", "caption": "x"}),
             json.dumps({"image": "c", "error": "e"})]
    with pytest.raises(job.record_guard.RecordLossError, match="1 of the images have no line"):
        job.check_lines(lines, ["a", "b", "c"])
    pairs, dead = job.check_lines(lines[1:] + [json.dumps({"image": "b", "caption": "y"})],
                                  ["c", "b", "a"])
    assert [image for image, _ in pairs] == ["a", "b", "c"] and dead == 1


def test_captioner_caption_with_model_is_bulk_captioning(monkeypatch):
    import serving.client.caption_client
    from pipeline import cli as captioner
    calls = []
    monkeypatch.setattr(cli, "main", lambda argv: calls.append(("bulk", argv)) or 0)
    monkeypatch.setattr(serving.client.caption_client, "caption_main",
                        lambda argv: calls.append(("server", argv)) or 0)
    for rest in (["a.png", "--model", "m"], ["--model=m", "a.png"],
                 ["a.png", "--model-name", "m"]):
        assert captioner._delegate("caption", rest) == 0
    assert calls == [("bulk", ["a.png", "--model", "m"]), ("bulk", ["--model=m", "a.png"]),
                     ("server", ["a.png", "--model-name", "m"])]


@pytest.mark.slow
def test_dask_runner_writes_the_direct_runners_lines(make_base, tmp_path, capsys):
    base = make_base({1: "image"})
    good, bad = _images(tmp_path / "images")
    outputs = {}
    for runner, extra in (("direct", []), ("dask", ["--workers", 2])):  # a local cluster
        outputs[runner] = tmp_path / f"{runner}.jsonl"
        status, err = _bulk([tmp_path / "images", "--model", base, "--runner", runner,
                             "--output", outputs[runner], *extra], capsys)
        assert status == 1, err  # the corrupt file
    direct, dask = _lines(outputs["direct"]), _lines(outputs["dask"])
    assert len(dask) == len(good) + 1
    # Batches may differ between runners, and with them the last bits of a score.
    for line in direct:
        if "score" in line:
            line["score"] = pytest.approx(line["score"], abs=1e-5)
    assert dask == direct
