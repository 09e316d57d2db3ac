"""`auto` precision: bfloat16 where the hardware multiplies it natively, float32 elsewhere."""
from __future__ import annotations

import pytest

from components.contract import precision

_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 avx512f {extra}
"""


def test_cpu_flags_parse_the_flags_line():
    assert {"avx2", "avx512f"} <= precision.cpu_flags(_CPUINFO.format(extra=""))
    assert precision.cpu_flags("model name : x\n") == set()


@pytest.mark.parametrize("extra", ["avx512_bf16", "amx_bf16 amx_tile", "avx512_bf16 amx_bf16"])
def test_cpu_with_native_bfloat16_gets_mixed_bfloat16(extra):
    chosen = precision.choose_auto(cpuinfo=_CPUINFO.format(extra=extra), gpus=[])
    assert chosen.policy == "mixed_bfloat16" and chosen.requested == "auto"
    assert "no GPU" in chosen.reason and extra.split()[0] in chosen.reason


def test_cpu_without_native_bfloat16_gets_float32():
    # avx512f alone (Ice Lake, Skylake): bfloat16 matmuls would be emulated.
    chosen = precision.choose_auto(cpuinfo=_CPUINFO.format(extra="avx512_vnni"), gpus=[])
    assert chosen.policy == "float32" and "emulated" in chosen.reason


@pytest.mark.parametrize("gpus, policy", [
    ([(8, 0)], "mixed_bfloat16"),              # A100
    ([(9, 0), (8, 6)], "mixed_bfloat16"),      # H100 + RTX 30xx
    ([(7, 5)], "float32"),                     # T4
    ([(8, 0), (7, 0)], "float32"),             # one V100 among them
    ([None], "float32"),                       # capability not reported
])
def test_gpus_decide_before_the_cpu(gpus, policy):
    # The CPU has bfloat16, but the GPUs do the training.
    chosen = precision.choose_auto(cpuinfo=_CPUINFO.format(extra="avx512_bf16"), gpus=gpus)
    assert chosen.policy == policy and "GPU compute capability" in chosen.reason


def test_resolve_explicit_policies_and_errors():
    assert precision.resolve("float32") == precision.Precision(
        "float32", "float32", "set in the config")
    assert precision.resolve("mixed_float16").policy == "mixed_float16"
    fake = precision.Precision("mixed_bfloat16", "auto", "test")
    assert precision.resolve("auto", choose=lambda: fake) is fake
    with pytest.raises(ValueError, match="auto, float32, mixed_float16, mixed_bfloat16"):
        precision.resolve("bfloat16")
    assert fake.as_properties() == {"mixed_precision": "mixed_bfloat16",
                                    "mixed_precision_requested": "auto",
                                    "mixed_precision_reason": "test"}


def test_without_arguments_it_reads_this_hosts_cpuinfo(monkeypatch):
    monkeypatch.setattr(precision, "gpu_compute_capabilities", lambda: [])
    with open("/proc/cpuinfo") as f:
        flags_line = next((l for l in f if l.split(":")[0].strip() == "flags"), "")
    native = {"avx512_bf16", "amx_bf16"} & set(flags_line.partition(":")[2].split())
    chosen = precision.choose_auto()
    assert chosen.policy == ("mixed_bfloat16" if native else "float32"), chosen
    assert "no GPU" in chosen.reason


def test_without_arguments_it_asks_for_the_gpus(monkeypatch):
    monkeypatch.setattr(precision, "gpu_compute_capabilities", lambda: [(7, 0)])
    chosen = precision.choose_auto(cpuinfo=_CPUINFO.format(extra="avx512_bf16"))
    assert chosen.policy == "float32" and "7.0" in chosen.reason


def test_gpu_compute_capabilities_lists_every_visible_gpu():
    import tensorflow as tf
    found = precision.gpu_compute_capabilities()
    assert len(found) == len(tf.config.list_physical_devices("GPU"))
    assert all(c is None or (len(c) == 2 and c >= (1, 0)) for c in found), found
