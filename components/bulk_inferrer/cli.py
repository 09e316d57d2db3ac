"""`captioner caption --model PATH IMAGE...`: bulk captioning without a server.

`pipeline/cli.py` hands `caption` command lines that name `--model` here
(the others go to the gRPC client, `serving.client.caption_client.caption_main`).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

EPILOG = """\
Output: one JSON line per image, sorted by image path, as `captioner caption
--json` prints them ({"image", "caption", "score", "tokens", "version"}), and
{"image", "error"} for an image that could not be read or decoded (a dead
letter). Exit status: 0 when every image was captioned, 1 when some were
dead-lettered or the lines did not account for every image (then nothing is
written), 2 for no model or no image. On a Dask cluster:
--runner dask --beam-arg=--dask_client_address=tcp://HOST:8786, with the model
and the images on a path every worker reads (a shared mount or gs://)."""


def _parser() -> argparse.ArgumentParser:
    from components.bulk_inferrer.job import DASK_WORKERS
    p = argparse.ArgumentParser(
        prog="captioner caption", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Caption images with an exported captioner SavedModel, as an Apache\n"
                    "Beam job (RunInference), without a server.")
    p.add_argument("images", nargs="*", metavar="IMAGE",
                   help="image files, folders (their .jpg .jpeg .png .gif .bmp files, "
                        "recursively) or globs; local or gs://")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="a SavedModel version folder (.../captioner/3) or a model base path "
                        "(.../captioner: the highest numbered version)")
    p.add_argument("--runner", choices=("direct", "dask"), default="direct",
                   help="Beam runner (default: direct)")
    p.add_argument("--beam-arg", action="append", default=[], metavar="ARG",
                   help="extra Beam pipeline option, repeatable, e.g. "
                        "--beam-arg=--dask_client_address=tcp://HOST:8786")
    p.add_argument("--output", metavar="FILE",
                   help="the JSON-lines file (default: stdout)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="most images per model call (RunInference batches; default: 8)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="local workers: the direct runner's processes (default 1), or the "
                        f"local Dask cluster's (default {DASK_WORKERS}) when no "
                        "--dask_client_address is given")
    p.add_argument("--signature", default="serving_default",
                   help="the SavedModel signature (default: serving_default)")
    p.add_argument("--json", action="store_true",
                   help="accepted for symmetry with the server client: the output is always "
                        "JSON lines")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs bulk captioning from a command line (the arguments after `caption`).

    Args:
      argv: the arguments, `--model PATH` among them (default: `sys.argv[1:]`).
    Returns:
      The exit status: 0 every image captioned, 1 some dead-lettered, lines
      lost or the cluster unusable, 2 no model or no image.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.batch_size < 1 or (args.workers is not None and args.workers < 1):
        parser.error("--batch-size and --workers must be at least 1")
    if not args.images:
        print("captioner caption: no images given: name image files, folders or globs",
              file=sys.stderr)
        return 2
    from components.bulk_inferrer import inputs, job
    from components.contract.errors import ActionableError
    try:
        counts = job.run_bulk_inference(args.model, args.images, args.output, args.runner,
                                        args.beam_arg, args.batch_size, args.workers,
                                        args.signature)
    except ActionableError as e:  # bad input (2), lost lines or an unreachable cluster (1)
        print(f"captioner caption: {e}", file=sys.stderr)
        return 2 if isinstance(e, inputs.BulkInputError) else 1
    return 1 if counts["dead_letters"] else 0


if __name__ == "__main__":
    sys.exit(main())
