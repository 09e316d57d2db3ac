"""CPU of hostile images: decode time without the checks, time to refusal with them, fairness.

    python benchmarks/decode_cpu.py                 # ~3 min on 2 CPU cores
    python benchmarks/decode_cpu.py --skip-fairness # the decode cases only (~1 min)

1. **Decode cases.** For each image: its size, its estimated decode work
   (`serving/limits/decode_work.py`), what decoding it costs without any check
   (`tf.io.decode_image(..., channels=3)` as the serving graph calls it, in
   this process, CPU seconds), and, under the default limits, whether it is
   refused and how long the server's checks take (headers, pixels, decode
   work: in process, and the whole gRPC round trip to a server).
2. **Fairness.** The server (`python -m serving.server.model_server`, the fixture model)
   is started twice: without the decode-work checks and CPU admission
   (`--max-decode-work 0 --decode-work-budget 0`, the server as it was) and
   with the defaults. Four clients send, back to back, the most expensive
   image the default `--max-decode-work` allows (a progressive 2000x2000
   JPEG whose last scan is repeated); a fifth sends one 640x480 JPEG every
   100 ms. Reported: the cost of one expensive request on the idle server,
   the normal request's own latency, and its p50/p99/max under the attack.
   Target: p99 <= 2 x expensive + own.

Prints the CPU model and flags, a table on stderr, and ONE JSON line on
stdout.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.results import cpuinfo, write_result  # noqa: E402
from serving.limits.decode_work import estimate  # noqa: E402
from serving.limits.image_headers import ImageHeaderError, check_pixels, probe_image  # noqa: E402
from serving.limits.work_admission import request_work  # noqa: E402
from serving.server.flags import DEFAULTS  # noqa: E402
from tests.serving.hostile_images import interlaced_png, jpeg, repeated_scan_jpeg, tiny_frame_gif  # noqa: E402

ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_tile")


def cpu_info() -> Dict[str, object]:
    """The CPU model, cores and the SIMD flags that matter to the decoders."""
    model, flags = cpuinfo()
    return {"model": model or "unknown", "cores": len(os.sched_getaffinity(0)),
            "flags": [f for f in ISA_FLAGS if f in flags]}


def decode_seconds(data: bytes, limit: float = 120.0) -> float:
    """CPU seconds of one `tf.io.decode_image(data, channels=3)` (NaN if it fails)."""
    import tensorflow as tf
    started = time.process_time()
    try:
        tf.io.decode_image(data, channels=3, expand_animations=False)
    except tf.errors.OpError:
        return float("nan")
    return time.process_time() - started


def check_seconds(data: bytes) -> tuple:
    """(refused message or '', seconds) of the server's checks under the defaults."""
    started = time.perf_counter()
    try:  # as the server does: headers read once, then the decode work
        info = check_pixels(data, DEFAULTS.max_image_pixels)
        request_work({"image_bytes": np.array([data], dtype=object)},
                     DEFAULTS.max_decode_work, 2 * DEFAULTS.max_decode_work,
                     [("image_bytes", 0, info)])
        message = ""
    except Exception as e:  # ServingError or ImageHeaderError: refused
        message = str(e)
    return message, time.perf_counter() - started


def _png_header(width: int, height: int) -> bytes:
    import zlib
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(
        ">I", zlib.crc32(b"IHDR" + ihdr) & 0xFFFFFFFF)
    return b"\x89PNG\r\n\x1a\n" + chunk + b"\x00" * 64


def cases(with_large: bool) -> Dict[str, bytes]:
    """The images: hostile ones over the limit, the most expensive allowed, real photos."""
    side = 2000
    allowed = (DEFAULTS.max_decode_work - 8 * side * side) // (side * side)
    out = {
        "progressive 2000x2000 grey, last scan x4000": repeated_scan_jpeg(side, 4000),
        "progressive 2000x2000 grey, last scan x2000": repeated_scan_jpeg(side, 2000),
        f"progressive 2000x2000 grey, last scan x{allowed} (allowed)":
            repeated_scan_jpeg(side, allowed),
        "progressive 8x8, last scan x500000": repeated_scan_jpeg(8, 500_000),
        "GIF 1x1, 30518 frames": tiny_frame_gif(30_518),
        "GIF 1x1, 1000000 frames": tiny_frame_gif(1_000_000),
        "PNG header claiming 100000x100000": _png_header(100_000, 100_000),
        # The same refusal with the 8x8 JPEG's size: what moving 5.5 MB costs.
        "PNG header claiming 100000x100000, padded to 5.5 MB":
            _png_header(100_000, 100_000) + b"\x00" * 5_500_420,
        "photo 4000x3000 baseline (PIL q90)": jpeg((4000, 3000), noise=8, quality=90),
        "photo 4000x3000 progressive (PIL)": jpeg((4000, 3000), noise=8, progressive=True),
    }
    if with_large:  # at the pixel limit: 8000x5000 = 40 M
        big = jpeg((8000, 5000), noise=8, quality=90, progressive=True, subsampling=0)
        out["photo 8000x5000 progressive 4:4:4 (PIL)"] = big
        # A diagonal gradient: compresses under --max-request-bytes, as photos do not.
        y, x = np.indices((5000, 8000), dtype=np.uint32)
        gradient = ((x + y) % 256).astype(np.uint8)
        out["photo 8000x5000 Adam7 PNG"] = interlaced_png(np.stack([gradient] * 3, -1))
        if shutil.which("cjpeg"):
            with tempfile.TemporaryDirectory() as tmp:
                from PIL import Image
                ppm = os.path.join(tmp, "in.ppm")
                Image.open(io.BytesIO(big)).save(ppm)
                out["photo 8000x5000 cjpeg -progressive"] = subprocess.run(
                    ["cjpeg", "-progressive", "-optimize", ppm], check=True,
                    capture_output=True).stdout
    return out


def measure_cases(with_large: bool, grpc_target: str = "") -> List[dict]:
    rows = []
    for name, data in cases(with_large).items():
        try:
            info = probe_image(data)
            work = estimate(data, info).work if info is not None else 0
        except ImageHeaderError:  # refused from the header (too many frames)
            info, work = None, 0
        message, check = check_seconds(data)
        check = min(check, check_seconds(data)[1])  # the second run: warm caches
        row = {"case": name, "bytes": len(data), "work": work, "refused": bool(message),
               "check_ms": round(check * 1e3, 2)}
        if grpc_target:
            seconds, row["grpc_code"] = _grpc_round_trip(grpc_target, data)
            row["grpc_ms"] = round(seconds * 1e3, 2)
        # An image the pixel limit refuses is not decoded here (it would take GBs).
        if info is None or info.pixels <= DEFAULTS.max_image_pixels:
            row["decode_s"] = round(decode_seconds(data), 3)
        row["message"] = message[:160]
        rows.append(row)
        print(f"{name:55s} {len(data):>10,d} B  work {work:>16,d}  decode "
              f"{row.get('decode_s', float('nan')):8.3f} s  {'refused' if message else 'allowed'} "
              f"in {row['check_ms']:.2f} ms" + (f" (gRPC {row['grpc_code']} in "
                                                  f"{row['grpc_ms']:.1f} ms)"
                                                  if grpc_target else ""),
              file=sys.stderr, flush=True)
    return rows


def _grpc_round_trip(target: str, data: bytes) -> tuple:
    """(seconds, status code name) of one Predict of `data`."""
    from serving.client.caption_client import CaptionClient, CaptionError
    with CaptionClient(target, timeout=300) as client:
        started = time.perf_counter()
        code = "OK"
        try:
            client.caption([data])
        except CaptionError as e:
            code = e.code.name
        return time.perf_counter() - started, code


def start_server(base: str, args: List[str]):
    from tests.reliability.server_process import ServerProcess
    log = tempfile.NamedTemporaryFile(suffix=".log", delete=False).name
    return ServerProcess(["--model-base-path", base, "--port", "0", "--rest-port", "0",
                          "--poll-seconds", "0", *args], log)


def fairness(base: str, args: List[str], seconds: float, clients: int,
             repeats: int = 0) -> dict:
    """The normal client's latency while `clients` send an expensive image.

    The image is the progressive 2000x2000 JPEG with its last scan repeated
    `repeats` times; 0: as often as the default --max-decode-work allows.
    """
    from serving.client.caption_client import CaptionClient, CaptionError
    side = 2000
    repeats = repeats or (DEFAULTS.max_decode_work - 8 * side * side) // (side * side)
    expensive = repeated_scan_jpeg(side, repeats)
    normal = jpeg((640, 480), color=(200, 30, 30), noise=8)
    server = start_server(base, args)
    try:
        client = CaptionClient(server.grpc_address, timeout=600)
        client.caption([normal])

        def timed(image):
            started = time.perf_counter()
            client.caption([image])
            return time.perf_counter() - started

        cost = float(np.median([timed(expensive) for _ in range(3)]))
        own = float(np.median([timed(normal) for _ in range(10)]))
        stop, answers = threading.Event(), []

        def attack():
            attacker = CaptionClient(server.grpc_address, timeout=600)
            while not stop.is_set():
                started = time.perf_counter()
                try:
                    attacker.caption([expensive])
                    answers.append(("OK", time.perf_counter() - started))
                except CaptionError as e:
                    answers.append((e.code.name, time.perf_counter() - started))

        threads = [threading.Thread(target=attack, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        time.sleep(cost)
        latencies = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            latencies.append(timed(normal))
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(600)
        ok = [s for code, s in answers if code == "OK"]
        return {"args": " ".join(args) or "(defaults)", "repeats": repeats, "expensive_s": round(cost, 3),
                "own_ms": round(own * 1e3, 1), "requests": len(latencies),
                "p50_ms": round(float(np.percentile(latencies, 50)) * 1e3, 1),
                "p99_ms": round(float(np.percentile(latencies, 99)) * 1e3, 1),
                "max_ms": round(max(latencies) * 1e3, 1),
                "p99_over_target": round(float(np.percentile(latencies, 99))
                                         / (2 * cost + own), 2),
                "expensive_ok": len(ok), "expensive_busy": len(answers) - len(ok),
                "expensive_mean_s": round(float(np.mean(ok)), 2) if ok else None,
                "server_alive": server.alive()}
    finally:
        server.stop()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="attack duration per server")
    p.add_argument("--clients", type=int, default=4, help="expensive clients at once")
    p.add_argument("--skip-fairness", action="store_true")
    p.add_argument("--skip-large", action="store_true", help="no 40 Mpx photos")
    p.add_argument("--issue-case", action="store_true",
                   help="also attack the server without checks with the 4000-scan JPEG")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cpu = cpu_info()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}",
          file=sys.stderr, flush=True)
    result = {"cpu": cpu, "date": time.strftime("%Y-%m-%d"), "defaults": {
        "max_image_pixels": DEFAULTS.max_image_pixels,
        "max_decode_work": DEFAULTS.max_decode_work}}
    with tempfile.TemporaryDirectory() as tmp:
        from tests.serving.fixtures import build_fixture_model
        base = os.path.join(tmp, "captioner")
        build_fixture_model(os.path.join(base, "1"))
        server = start_server(base, [])
        try:
            result["cases"] = measure_cases(not args.skip_large, server.grpc_address)
        finally:
            server.stop()
        if not args.skip_fairness:
            result["fairness"] = []
            off = ["--max-decode-work", "0", "--decode-work-budget", "0"]
            runs = [("without checks", off, 0), ("with the defaults", [], 0)]
            if args.issue_case:
                runs.insert(1, ("without, x4000", off, 4000))
            for label, flags, repeats in runs:
                row = fairness(base, flags, args.seconds, args.clients, repeats)
                row["label"] = label
                result["fairness"].append(row)
                print(f"{label:18s} expensive alone {row['expensive_s']:.2f} s, normal alone "
                      f"{row['own_ms']:.1f} ms; under {args.clients} expensive clients: normal "
                      f"p50 {row['p50_ms']:.0f} ms p99 {row['p99_ms']:.0f} ms max "
                      f"{row['max_ms']:.0f} ms ({row['requests']} requests; p99 / target "
                      f"{row['p99_over_target']}); expensive OK {row['expensive_ok']} "
                      f"(mean {row['expensive_mean_s']} s), busy {row['expensive_busy']}",
                      file=sys.stderr, flush=True)
    print(json.dumps(result))
    write_result("decode_cpu", result, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
