"""Serving benchmark: latency, throughput, batching gain and server overhead.

    python benchmarks/serving.py                      # fixture model, ~2.5 min on 2 CPU cores
    python benchmarks/serving.py --model-base-path /srv/serving/captioner --image dog.jpg
    python benchmarks/serving.py --decoder-units 0    # near-free model: the fixed overhead

Measures, for the project's server (`python -m serving.server.model_server`, started as a
separate process, as deployed) with dynamic batching off and on:
p50/p99 latency and throughput of single-image `Predict` calls made by
`CaptionClient` at concurrency 1, 8 and 32; and the overhead of serving at
concurrency 1 as the ratio of the server's p50 latency to the p50 of calling
the same SavedModel signature in process (`tf.saved_model.load`, one image,
outputs fetched to numpy), the two alternating call by call (see `overhead`).
The absolute overhead (`overhead_ms`, about 1-2 ms here) is what the
server adds; the ratio depends on how costly the model is. The REST API's
overhead (`rest_overhead`: one keep-alive connection posting
`{"instances": [{"b64": ...}]}`) is measured the same way;
`--overhead-only` measures only these two (about 1 min); `--repeats N`
measures them N times and reports the run with the median ratio;
`--server-flag=--tensorflow_intra_op_parallelism=1` (repeatable) passes a
flag to the server.

Without `--model-base-path` the model is the test fixture
(`tests/serving/fixtures.py`) with a decoder-sized workload (`--decoder-units`
x 4 units LSTM-style matmuls for `--decoder-steps` steps), which, like the
real beam-search decoder, costs almost as much for one image as for a
batch. Targets: ratio <= 1.15; throughput at concurrency 32 with batching
>= 2x without.

Prints a table on stderr and ends with ONE JSON line on stdout: figures per
mode and concurrency, `batching_speedup_c32`, and the overhead as `ratio`;
the same figures go to `benchmarks/results/` (`benchmarks/results.py`).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence, Set

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.results import host, write_result  # noqa: E402


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def percentile(values: List[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def make_image(size: int) -> bytes:
    """A JPEG of smooth noise, like a photo at the encoder's input size."""
    from PIL import Image
    rng = np.random.RandomState(0)
    small = rng.randint(0, 256, (8, 8, 3)).astype(np.uint8)
    image = Image.fromarray(small).resize((size, size), Image.BILINEAR)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def latest_version(base: str) -> str:
    versions = [int(v) for v in os.listdir(base) if v.isdigit()
                and os.path.exists(os.path.join(base, v, "saved_model.pb"))]
    if not versions:
        raise SystemExit(f"no version folder with a saved_model.pb under {base}")
    return os.path.join(base, str(max(versions)))


def in_process_caller(version_dir: str, image: bytes):
    """A function that runs the signature in process on one image, outputs to numpy."""
    import tensorflow as tf
    function = tf.saved_model.load(version_dir).signatures["serving_default"]
    batch = np.array([image], dtype=object)

    def call():
        outputs = function(image_bytes=tf.convert_to_tensor(batch, dtype=tf.string))
        return {k: v.numpy() for k, v in outputs.items()}

    for _ in range(5):
        call()
    return call


def timed(call, seconds: float, at_least: int = 10) -> List[float]:
    latencies, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline or len(latencies) < at_least:
        start = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - start)
    return latencies


def alternate(local_call, remote_call, seconds: float) -> tuple[list, list]:
    """Latencies (s) of the two calls, alternated one by one after 2 s of warm-up.

    Runs for `seconds` and at least 20 pairs, so that load from other
    processes on a shared machine hits both alike.
    """
    local, served = [], []
    warm_until = time.monotonic() + 2.0
    while time.monotonic() < warm_until:
        remote_call()
        local_call()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or len(served) < 20:
        for call, out in ((local_call, local), (remote_call, served)):
            start = time.perf_counter()
            call()
            out.append(time.perf_counter() - start)
    return local, served


def overhead(local_call, address: str, model_name: str, image: bytes,
             seconds: float) -> Dict[str, float]:
    """Server vs in-process latency at concurrency 1.

    In-process and served calls alternate one by one, so that load from
    other processes on a shared machine hits both alike; the ratio is of
    the two medians.
    """
    from serving.client.caption_client import CaptionClient

    with CaptionClient(address, model_name, timeout=120) as client:
        local, served = alternate(local_call, lambda: client.caption([image]), seconds)
    return {"in_process_p50_ms": 1e3 * percentile(local, 50),
            "in_process_p99_ms": 1e3 * percentile(local, 99),
            "served_p50_ms": 1e3 * percentile(served, 50),
            "served_p99_ms": 1e3 * percentile(served, 99),
            "overhead_ms": 1e3 * (percentile(served, 50) - percentile(local, 50)),
            "ratio": percentile(served, 50) / percentile(local, 50),
            "pairs": len(served)}


def rest_overhead(local_call, rest_url: str, model_name: str, image: bytes,
                  seconds: float) -> Dict[str, float]:
    """REST vs in-process latency at concurrency 1, alternating like `overhead`.

    One keep-alive HTTP/1.1 connection posts `{"instances": [{"b64": ...}]}`
    to `:predict`; the time includes JSON encoding and decoding on both ends.
    """
    import base64
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(rest_url)
    body = json.dumps({"instances": [{"b64": base64.b64encode(image).decode()}]}).encode()
    path = f"/v1/models/{model_name}:predict"
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)

    def remote_call():
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"REST predict failed: {response.status} {payload[:200]!r}")
        return json.loads(payload)

    try:
        local, served = alternate(local_call, remote_call, seconds)
    finally:
        connection.close()
    return {"in_process_p50_ms": 1e3 * percentile(local, 50),
            "rest_p50_ms": 1e3 * percentile(served, 50),
            "rest_p99_ms": 1e3 * percentile(served, 99),
            "overhead_ms": 1e3 * (percentile(served, 50) - percentile(local, 50)),
            "ratio": percentile(served, 50) / percentile(local, 50),
            "pairs": len(served)}


class ServerProcess:
    """`python -m serving.server.model_server` on free loopback ports, stopped with SIGTERM."""

    def __init__(self, base: str, model_name: str, batching: Optional[Dict[str, int]],
                 extra: Sequence[str] = (), cpus: Optional[Set[int]] = None):
        command = [sys.executable, "-m", "serving.server.model_server", "--model-base-path", base,
                   "--model-name", model_name, "--port", "0", "--rest-port", "0",
                   "--poll-seconds", "30", "--log-level", "WARNING", *extra]
        if batching:
            command += ["--enable-batching"] + [
                f"--{k.replace('_', '-')}={v}" for k, v in batching.items()]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)
        if cpus:
            # `cpus`: the server runs on these CPUs only. Popen returns once the child has
            # exec'd, before Python starts any thread there, and threads inherit the affinity
            # (no preexec_fn: unsafe in this process, whose TensorFlow threads already run).
            os.sched_setaffinity(self.process.pid, cpus)
        self.address = self.rest_url = None
        for line in self.process.stdout:
            match = re.match(r"serving: grpc=(\S+) rest=(\S+)", line)
            if match:
                self.address, self.rest_url = match.group(1), "http://" + match.group(2)
                break
        if self.address is None:
            raise SystemExit(f"server did not start (exit {self.process.wait()})")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def load(address: str, model_name: str, image: bytes, concurrency: int, seconds: float,
         warmup: float) -> Dict[str, float]:
    """Closed-loop load: `concurrency` threads, each with its own channel."""
    from serving.client.caption_client import CaptionClient

    latencies: List[List[float]] = [[] for _ in range(concurrency)]
    errors = [0]
    phase = {"record": False, "stop": False}
    ready = threading.Barrier(concurrency + 1)

    def worker(i: int) -> None:
        with CaptionClient(address, model_name, timeout=120) as client:
            client.caption([image])
            ready.wait()
            while not phase["stop"]:
                start = time.perf_counter()
                try:
                    client.caption([image])
                except Exception:
                    errors[0] += 1
                    continue
                if phase["record"]:
                    latencies[i].append(time.perf_counter() - start)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    ready.wait()
    time.sleep(warmup)
    phase["record"] = True
    started = time.monotonic()
    time.sleep(seconds)
    phase["record"] = False
    elapsed = time.monotonic() - started
    phase["stop"] = True
    for thread in threads:
        thread.join()
    flat = [x for per in latencies for x in per]
    return {"p50_ms": 1e3 * percentile(flat, 50), "p99_ms": 1e3 * percentile(flat, 99),
            "rps": len(flat) / elapsed, "requests": len(flat), "errors": errors[0]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-base-path", help="serve this model instead of the fixture")
    p.add_argument("--model-name", default="captioner")
    p.add_argument("--image", help="image file to send (default: a generated JPEG)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--decoder-units", type=int, default=512, help="fixture workload size")
    p.add_argument("--decoder-steps", type=int, default=60, help="fixture workload steps")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per level")
    p.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds per level")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-timeout-micros", type=int, default=2000)
    p.add_argument("--num-batch-threads", type=int, default=2)
    p.add_argument("--overhead-only", action="store_true",
                   help="only the gRPC and REST overhead at concurrency 1 (no load levels)")
    p.add_argument("--server-flag", action="append", default=[], metavar="FLAG",
                   help="a flag for the server (repeatable), e.g. "
                        "--server-flag=--tensorflow_intra_op_parallelism=1")
    p.add_argument("--repeats", type=int, default=1,
                   help="overhead measurements (each 2 x --seconds per API); the medians of "
                        "their ratios are reported")
    return p


def _model(args, image: bytes, tmp: tempfile.TemporaryDirectory) -> tuple[str, str]:
    """(base path, description) of the model to serve: the given one or the fixture."""
    if args.model_base_path:
        return args.model_base_path, "given"
    from tests.serving.fixtures import build_fixture_model
    base = os.path.join(tmp.name, args.model_name)
    build_fixture_model(os.path.join(base, "1"), image_size=args.image_size,
                        decoder_units=args.decoder_units, decoder_steps=args.decoder_steps,
                        warmup_images=[image] * 4)
    return base, f"fixture(units={args.decoder_units}, steps={args.decoder_steps})"


def _median_run(runs: List[Dict[str, float]]) -> Dict[str, float]:
    """The run whose ratio is the median (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r["ratio"])[(len(runs) - 1) // 2]


def _overheads(server: ServerProcess, local_call, args, image: bytes) -> tuple[dict, dict]:
    """gRPC and REST overhead at concurrency 1, each the median of `--repeats` runs."""
    grpc_runs, rest_runs = [], []
    for _ in range(max(1, args.repeats)):
        cost = overhead(local_call, server.address, args.model_name, image, 2 * args.seconds)
        log(f"overhead at c=1: in process p50 {cost['in_process_p50_ms']:.2f} ms, "
            f"served p50 {cost['served_p50_ms']:.2f} ms, +{cost['overhead_ms']:.2f} ms, "
            f"ratio {cost['ratio']:.3f}")
        rest_cost = rest_overhead(local_call, server.rest_url, args.model_name, image,
                                  2 * args.seconds)
        log(f"REST overhead at c=1: in process p50 {rest_cost['in_process_p50_ms']:.2f} "
            f"ms, REST p50 {rest_cost['rest_p50_ms']:.2f} ms, "
            f"+{rest_cost['overhead_ms']:.2f} ms, ratio {rest_cost['ratio']:.3f}")
        grpc_runs.append(cost)
        rest_runs.append(rest_cost)
    cost, rest_cost = _median_run(grpc_runs), _median_run(rest_runs)
    if len(grpc_runs) > 1:
        cost = dict(cost, ratios=[round(r["ratio"], 3) for r in grpc_runs])
        rest_cost = dict(rest_cost, ratios=[round(r["ratio"], 3) for r in rest_runs])
    return cost, rest_cost


def _rounded(figures: Dict[str, object]) -> Dict[str, object]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    image = open(args.image, "rb").read() if args.image else make_image(args.image_size)
    tmp = tempfile.TemporaryDirectory(prefix="serving-bench-")
    base, model = _model(args, image, tmp)
    log(f"host: {host()['cpu']}, {os.cpu_count()} CPUs; model {model}")
    local_call = in_process_caller(latest_version(base), image)
    batching = {"max_batch_size": args.max_batch_size,
                "batch_timeout_micros": args.batch_timeout_micros,
                "num_batch_threads": args.num_batch_threads}
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    for mode, params in (("no_batching", None), ("batching", batching)):
        server = ServerProcess(base, args.model_name, params, args.server_flag)
        try:
            if params is None:
                cost, rest_cost = _overheads(server, local_call, args, image)
                if args.overhead_only:
                    break
            results[mode] = {}
            for c in levels:
                r = load(server.address, args.model_name, image, c, args.seconds, args.warmup)
                results[mode][f"c{c}"] = r
                log(f"{mode:12s} c={c:<3d} p50 {r['p50_ms']:8.2f} ms  p99 {r['p99_ms']:8.2f} ms"
                    f"  {r['rps']:8.1f} req/s  errors {r['errors']}")
        finally:
            server.stop()
    tmp.cleanup()
    summary = {"benchmark": "serving-overhead" if args.overhead_only else "serving",
               "model": model, "image_bytes": len(image), "cpus": os.cpu_count(),
               "server_flags": args.server_flag,
               "overhead": _rounded(cost), "rest_overhead": _rounded(rest_cost)}
    if not args.overhead_only:
        top = max(levels)
        speedup = results["batching"][f"c{top}"]["rps"] / results["no_batching"][f"c{top}"]["rps"]
        summary.update(results={m: {c: _rounded(r) for c, r in by.items()}
                                for m, by in results.items()},
                       ratio=round(cost["ratio"], 3))
        summary[f"batching_speedup_c{top}"] = round(speedup, 3)
        summary["targets_met"] = bool(summary["ratio"] <= 1.15 and speedup >= 2.0)
    print(json.dumps(summary), flush=True)
    write_result("serving", summary, argv=argv,
                 variant="overhead" if args.overhead_only else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
