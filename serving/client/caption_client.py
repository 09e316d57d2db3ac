"""gRPC client for the captioner, for TF Serving or this project's server alike.

Built on TF Serving's API messages (`serving/protos.py`: the
`tensorflow-serving-api` definitions, loaded without TensorFlow), grpc and
numpy: images go out as raw encoded bytes in a `tf.string` tensor
(`image_bytes`), so the same client works against `tensorflow_model_server`
and `captioner serve`.

    from serving.client.caption_client import CaptionClient
    with CaptionClient("localhost:8500") as client:
        for result in client.caption([open("dog.jpg", "rb").read()]):
            print(result["caption"], result["score"])

Command line (`captioner caption`):

    captioner caption dog.jpg cat.png --server localhost:8500 [--json]
        [--attention-out figures/]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import grpc
import numpy as np

from serving import protos
from serving.tensors import dtype_name, ndarray_to_tensor_proto, tensor_proto_to_ndarray

_HINTS = {
    grpc.StatusCode.UNAVAILABLE: "is a model server listening there (and TLS set the same "
                                 "way on both sides)?",
    grpc.StatusCode.NOT_FOUND: "check the model name and version (GetModelStatus lists them)",
    grpc.StatusCode.FAILED_PRECONDITION: "check the signature name (metadata() lists them)",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "the request is larger than the server accepts "
                                        "(send fewer or smaller images), or the server is "
                                        "busy decoding others (retry later)",
    grpc.StatusCode.DEADLINE_EXCEEDED: "raise the timeout or send fewer images per request",
}


# What gRPC says when the peer answers in HTTP/1.x (a REST port, a web server).
_HTTP1_MARKERS = ("Failed parsing HTTP/2", "Trying to connect an http1.x server",
                  "Expected SETTINGS frame")


def is_http1_peer(code: grpc.StatusCode, details: str) -> bool:
    """True when a failed call reached an HTTP/1.x server instead of a gRPC one."""
    return code == grpc.StatusCode.UNAVAILABLE and any(m in (details or "")
                                                       for m in _HTTP1_MARKERS)


class CaptionError(Exception):
    """A failed call, with the gRPC status code and the server's details.

    Attributes:
      code: the `grpc.StatusCode`.
      details: the server's message.
      method: the RPC that failed.
      target: the server address.
    """

    def __init__(self, code: grpc.StatusCode, details: str, method: str = "", target: str = ""):
        self.code = code
        self.details = details or ""
        self.method = method
        self.target = target
        hint = _HINTS.get(code)
        if is_http1_peer(code, self.details):
            hint = ("that is an HTTP/1.1 port, such as the REST port (8501 by default): "
                    "give the gRPC port (8500 by default) to --server")
        message = f"{method} on {target} failed: {code.name}: {self.details}"
        super().__init__(message + (f" ({hint})" if hint else ""))


@dataclass(frozen=True)
class ClientOptions:
    """How a `CaptionClient` retries and sizes its calls.

    Attributes:
      max_attempts: tries per call when the server is UNAVAILABLE.
      initial_backoff, max_backoff: exponential backoff bounds (seconds)
        between those tries, with jitter.
      input_name: the image input's name in the signature.
      max_message_bytes: largest message sent or received.
    """
    max_attempts: int = 5
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    input_name: str = "image_bytes"
    max_message_bytes: int = 256 << 20


class CaptionClient:
    """Captions images through TF Serving's PredictionService.

    Args:
      target: `host:port` of the gRPC API.
      model_name: the served model's name.
      signature: the signature for `caption` (default `serving_default`).
      version: a version number, a version label (str), or None for the
        latest.
      timeout: seconds per attempt of each call.
      root_certificates: PEM bytes (or a path to a PEM file) of the CA that
        signed the server's certificate; enables TLS.
      options: retries and message sizes (`ClientOptions`); None: the defaults.
    """

    def __init__(self, target: str, model_name: str = "captioner",
                 signature: str = "serving_default",
                 version: Optional[Union[int, str]] = None, timeout: float = 30.0,
                 root_certificates: Optional[Union[bytes, str]] = None, *,
                 options: Optional[ClientOptions] = None):
        options = options or ClientOptions()
        self.target = target
        self.model_name = model_name
        self.signature = signature
        self.timeout = timeout
        self.max_attempts = max(1, options.max_attempts)
        self.initial_backoff = options.initial_backoff
        self.max_backoff = options.max_backoff
        self.input_name = options.input_name
        self.version: Optional[int] = None
        self.version_label: Optional[str] = None
        if isinstance(version, str) and not version.isdigit():
            self.version_label = version
        elif version is not None:
            self.version = int(version)
        self._channel = _channel(target, root_certificates, options)
        self._predictions = protos.PredictionService.on(self._channel)
        self._models = protos.ModelService.on(self._channel)

    # -- plumbing ----------------------------------------------------------

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "CaptionClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def model_spec(self, signature: Optional[str] = None):
        """The ModelSpec requests carry (name, version or label, signature)."""
        spec = protos.ModelSpec(name=self.model_name)
        if signature is not None:
            spec.signature_name = signature
        if self.version is not None:
            spec.version.value = self.version
        elif self.version_label:
            spec.version_label = self.version_label
        return spec

    def _call(self, method, name: str, request):
        """One RPC, retried with backoff while the server is UNAVAILABLE."""
        delay = self.initial_backoff
        for attempt in range(self.max_attempts):
            try:
                return method(request, timeout=self.timeout)
            except grpc.RpcError as e:
                code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
                details = e.details() if callable(getattr(e, "details", None)) else str(e)
                # An HTTP/1.x peer will not turn into a gRPC server: no retry.
                if (code == grpc.StatusCode.UNAVAILABLE and attempt + 1 < self.max_attempts
                        and not is_http1_peer(code, details)):
                    time.sleep(delay * random.uniform(0.8, 1.2))
                    delay = min(delay * 2, self.max_backoff)
                    continue
                raise CaptionError(code, details, name, self.target) from None

    # -- API ---------------------------------------------------------------

    def predict(self, inputs: Mapping[str, Any], signature: Optional[str] = None,
                output_filter: Sequence[str] = ()) -> Dict[str, np.ndarray]:
        """Generic Predict: named arrays in, named arrays out.

        Args:
          inputs: input alias -> array (lists of bytes/str become tf.string).
          signature: the signature (default: the client's).
          output_filter: the outputs to return (default: all).
        """
        return self._predict(inputs, signature, output_filter)[0]

    def _predict(self, inputs, signature, output_filter):
        """(outputs, the version that answered)."""
        request = protos.PredictRequest(
            model_spec=self.model_spec(self.signature if signature is None else signature),
            output_filter=list(output_filter))
        for name, value in inputs.items():
            ndarray_to_tensor_proto(value, out=request.inputs[name])
        response = self._call(self._predictions.Predict, "Predict", request)
        version = (response.model_spec.version.value
                   if response.model_spec.HasField("version") else None)
        outputs = {name: tensor_proto_to_ndarray(proto) for name, proto in response.outputs.items()}
        return outputs, version

    def caption(self, images: Sequence[bytes], attention: bool = True) -> List[Dict[str, Any]]:
        """Captions encoded images (JPEG/PNG/GIF/BMP bytes), one request.

        Args:
          images: encoded image bytes.
          attention: also fetch the attention maps (else they are filtered
            out on the server, which saves bandwidth).
        Returns:
          One dict per image: `caption` (str), `score` (float log-probability),
          `tokens` (int32 `[length]`), `length` (int), `attention` (float32
          `[length, H, W]`, or None), `version` (int, the version that answered).
          Tokens and attention are cut to the caption's length, so padding
          (which depends on the other images in a batch) never shows.
        Raises:
          CaptionError: the server refused or failed the request.
        """
        images = list(images)
        if not images:
            return []
        array = np.empty(len(images), dtype=object)
        array[:] = [bytes(image) for image in images]
        wanted = () if attention else ("caption", "tokens", "lengths", "score")
        outputs, version = self._predict({self.input_name: array}, None, wanted)
        return self._results(outputs, len(images), version)

    def caption_annotations(self, annotations: np.ndarray,
                            signature: str = "caption_annotations") -> List[Dict[str, Any]]:
        """Captions precomputed annotation grids `(batch, L, D)` (the second signature)."""
        annotations = np.asarray(annotations, dtype=np.float32)
        outputs, version = self._predict({"annotations": annotations}, signature, ())
        return self._results(outputs, annotations.shape[0], version)

    def _results(self, outputs: Dict[str, np.ndarray], batch: int,
                 version: Optional[int]) -> List[Dict[str, Any]]:
        missing = {"caption", "score"} - set(outputs)
        if missing:
            raise CaptionError(grpc.StatusCode.INTERNAL,
                               f"response lacks outputs {sorted(missing)}; is this the "
                               f"captioner's signature?", "Predict", self.target)
        return caption_results(outputs, batch, version)

    def metadata(self, raw: bool = False):
        """The served signatures (GetModelMetadata).

        Returns:
          With `raw`, the GetModelMetadataResponse. Otherwise a dict:
          `{"name", "version", "signatures": {key: {"method_name",
          "inputs": {alias: {"dtype": "DT_STRING", "shape": [-1]}},
          "outputs": {...}}}}` (-1 for an unknown dimension).
        """
        request = protos.GetModelMetadataRequest(
            model_spec=self.model_spec(), metadata_field=["signature_def"])
        response = self._call(self._predictions.GetModelMetadata, "GetModelMetadata", request)
        if raw:
            return response
        signature_map = protos.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)

        def tensors(infos):
            return {alias: {"dtype": dtype_name(info.dtype),
                            "shape": None if info.tensor_shape.unknown_rank
                            else [d.size for d in info.tensor_shape.dim]}
                    for alias, info in sorted(infos.items())}

        return {
            "name": response.model_spec.name,
            "version": response.model_spec.version.value,
            "signatures": {key: {"method_name": sig.method_name,
                                 "inputs": tensors(sig.inputs),
                                 "outputs": tensors(sig.outputs)}
                           for key, sig in sorted(signature_map.signature_def.items())},
        }

    def status(self) -> List[Dict[str, Any]]:
        """Versions and their states (ModelService.GetModelStatus), newest first."""
        request = protos.GetModelStatusRequest(model_spec=self.model_spec())
        response = self._call(self._models.GetModelStatus, "GetModelStatus", request)
        states = protos.VERSION_STATE.values_by_number
        return [{"version": s.version, "state": states[s.state].name,
                 "error_code": s.status.error_code, "error_message": s.status.error_message}
                for s in response.model_version_status]


def caption_results(outputs: Mapping[str, np.ndarray], batch: int,
                    version: Optional[int]) -> List[Dict[str, Any]]:
    """One result per image from the captioner signature's batch-major outputs.

    Shared by `CaptionClient.caption` and bulk captioning, so that both cut
    and convert the outputs the same way.

    Args:
      outputs: `caption`, `score` and optionally `tokens`, `lengths`,
        `attention`, each `[batch, ...]`.
      batch: the number of images.
      version: the model version that answered (None if unknown).
    Returns:
      The dicts `CaptionClient.caption` documents.
    """
    results = []
    for i in range(batch):
        tokens = outputs["tokens"][i] if "tokens" in outputs else np.zeros(0, np.int32)
        length = int(outputs["lengths"][i]) if "lengths" in outputs else len(tokens)
        length = min(length, len(tokens)) if len(tokens) else length
        caption = outputs["caption"][i]
        attention = outputs.get("attention")
        results.append({
            "caption": caption.decode("utf-8", "replace") if isinstance(caption, bytes)
            else str(caption),
            "score": float(outputs["score"][i]),
            "tokens": np.asarray(tokens[:length]),
            "length": length,
            "attention": None if attention is None else np.asarray(attention[i][:length]),
            "version": version,
        })
    return results


def json_line(image: str, result: Mapping[str, Any]) -> Dict[str, Any]:
    """The `--json` line of a captioned image (`captioner caption`, with or without a server)."""
    return {"image": image, "caption": result["caption"], "score": result["score"],
            "tokens": np.asarray(result["tokens"]).tolist(), "version": result["version"]}


def _channel(target: str, root_certificates: Optional[Union[bytes, str]],
             options: ClientOptions) -> grpc.Channel:
    """A channel to `target`, with TLS when `root_certificates` is given."""
    # The channel's own reconnect backoff (1 s, growing, by default) would
    # make retries fail fast until it elapses: keep it at the client's pace.
    backoff_ms = max(10, int(options.initial_backoff * 1000))
    channel_options = [
        ("grpc.max_receive_message_length", options.max_message_bytes),
        ("grpc.max_send_message_length", options.max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", backoff_ms),
        ("grpc.min_reconnect_backoff_ms", backoff_ms),
        ("grpc.max_reconnect_backoff_ms", max(backoff_ms, int(options.max_backoff * 1000)))]
    if root_certificates is None:
        return grpc.insecure_channel(target, options=channel_options)
    if isinstance(root_certificates, str):
        with open(root_certificates, "rb") as f:
            root_certificates = f.read()
    credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
    return grpc.secure_channel(target, credentials, options=channel_options)


def _parser() -> argparse.ArgumentParser:
    from serving.cli_help import DefaultsHelpFormatter
    p = argparse.ArgumentParser(prog="captioner caption", formatter_class=DefaultsHelpFormatter,
                                description="Caption images with a served captioner. With "
                                            "--model PATH (a SavedModel) instead of --server, "
                                            "captions them in bulk as a Beam job, without a "
                                            "server (`captioner caption --model PATH --help`).")
    p.add_argument("images", nargs="+", help="image files (JPEG, PNG, GIF, BMP)")
    p.add_argument("--server", default="localhost:8500", help="gRPC host:port")
    p.add_argument("--model-name", default="captioner")
    p.add_argument("--version", help="version number or label (default: latest)")
    p.add_argument("--signature", default="serving_default")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--attention-out", metavar="DIR",
                   help="write a PNG of per-word attention maps per image here")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--root-cert", help="PEM CA certificate: connect with TLS")
    p.add_argument("--batch-size", type=int, default=8, help="images per request")
    return p


def caption_main(argv: Optional[Sequence[str]] = None) -> int:
    """`captioner caption IMAGE... --server HOST:PORT`.

    Prints `IMAGE<TAB>CAPTION<TAB>score=S` per image (or JSON lines with
    `--json`). Returns 0 when every image was captioned, 1 otherwise.
    """
    args = _parser().parse_args(argv)
    items, failures = [], 0

    def failed(path: str, error: str) -> None:
        # stderr always; with --json also a line on stdout, so every image has one.
        print(f"{path}: {error}", file=sys.stderr, flush=True)
        if args.json:
            print(json.dumps({"image": path, "error": error}), flush=True)

    for path in args.images:
        try:
            with open(path, "rb") as f:
                items.append((path, f.read()))
        except OSError as e:
            failed(path, f"cannot read: {e.strerror or e}")
            failures += 1
    if args.attention_out:
        os.makedirs(args.attention_out, exist_ok=True)
    want_attention = bool(args.attention_out)
    with CaptionClient(args.server, args.model_name, args.signature, args.version,
                       args.timeout, args.root_cert) as client:
        step = max(1, args.batch_size)
        for start in range(0, len(items), step):
            chunk = items[start:start + step]
            try:
                pairs = list(zip(chunk, client.caption([data for _, data in chunk],
                                                       attention=want_attention), strict=True))
            except CaptionError as e:
                if e.code != grpc.StatusCode.INVALID_ARGUMENT:
                    print(f"captioner caption: {e}", file=sys.stderr)
                    if args.json:  # the images not captioned, one line each
                        for path, _ in items[start:]:
                            print(json.dumps({"image": path, "error": str(e)}), flush=True)
                    return 1
                pairs = []
                for item in chunk:  # find the image the server refused
                    try:
                        pairs.append((item, client.caption([item[1]],
                                                           attention=want_attention)[0]))
                    except CaptionError as one:
                        pairs.append((item, f"{one.code.name}: {one.details}"))
            for (path, data), result in pairs:
                if isinstance(result, str):  # this image was refused (in input order)
                    failed(path, result)
                    failures += 1
                    continue
                figure = None
                if want_attention and result["attention"] is not None:
                    from serving.client.attention_figure import save_attention_figure
                    name = os.path.splitext(os.path.basename(path))[0] + ".attention.png"
                    figure = save_attention_figure(data, result["caption"].split(),
                                                   result["attention"],
                                                   os.path.join(args.attention_out, name))
                if args.json:
                    line = json_line(path, result)
                    if figure:
                        line["attention_figure"] = figure
                    print(json.dumps(line), flush=True)
                else:
                    print(f"{path}\t{result['caption']}\tscore={result['score']:.4f}",
                          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(caption_main())
