"""The Keras dtype policy a stage trains in: `auto` picks the hardware's native one.

`auto` means bfloat16 compute with float32 variables (`mixed_bfloat16`) where
the hardware multiplies bfloat16 matrices natively, float32 elsewhere:

* a GPU is used for training when TensorFlow sees one, so GPUs decide first:
  all of compute capability 8.0 or later (Ampere, Hopper, ...) give
  `mixed_bfloat16`, any older one `float32`;
* without a GPU, the CPU flags `avx512_bf16` (AVX512-BF16: Cooper Lake, Zen 4
  and later) or `amx_bf16` (AMX: Sapphire Rapids and later) give
  `mixed_bfloat16`; without them TensorFlow emulates bfloat16 matmuls, which
  measured slower than float32, so `float32`.

`mixed_float16` is never chosen automatically: it needs loss scaling and
gains only on GPUs, where bfloat16 is as fast and needs none.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
AUTO = "auto"
CHOICES = (AUTO,) + POLICIES
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
MIN_BF16_COMPUTE_CAPABILITY = (8, 0)


@dataclasses.dataclass(frozen=True)
class Precision:
    """A resolved precision.

    Attributes:
      policy: the Keras dtype policy name (one of `POLICIES`).
      requested: what the config asked for (`auto` or a policy).
      reason: one line saying why `policy` was chosen.
    """
    policy: str
    requested: str
    reason: str

    def as_properties(self) -> dict:
        """The artifact properties that record the choice."""
        return {"mixed_precision": self.policy, "mixed_precision_requested": self.requested,
                "mixed_precision_reason": self.reason}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU feature flags of `/proc/cpuinfo` (or of the given text).

    Args:
      cpuinfo: the text of a cpuinfo file; None reads `/proc/cpuinfo`.
    Returns:
      The set of flags of the first `flags` line (empty where there is none,
      e.g. on macOS or Windows).
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def gpu_compute_capabilities() -> list[tuple[int, int] | None]:
    """The compute capability of each GPU TensorFlow sees (None where it reports none)."""
    import tensorflow as tf
    capabilities = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        capabilities.append(tuple(capability) if capability else None)
    return capabilities


def choose_auto(cpuinfo: str | None = None,
                gpus: Sequence[tuple[int, int] | None] | None = None) -> Precision:
    """The native precision of this host's training device (see the module docstring).

    Args:
      cpuinfo: cpuinfo text (None: `/proc/cpuinfo`).
      gpus: compute capabilities of the visible GPUs (None: ask TensorFlow).
    Returns:
      The `Precision` with `requested="auto"`.
    """
    if gpus is None:
        gpus = gpu_compute_capabilities()
    if gpus:
        shown = ", ".join("unknown" if c is None else f"{c[0]}.{c[1]}" for c in gpus)
        if all(c is not None and tuple(c) >= MIN_BF16_COMPUTE_CAPABILITY for c in gpus):
            return Precision("mixed_bfloat16", AUTO,
                             f"GPU compute capability {shown} >= 8.0: native bfloat16")
        return Precision("float32", AUTO,
                         f"GPU compute capability {shown}: no native bfloat16 on every GPU")
    native = sorted(set(BF16_CPU_FLAGS) & cpu_flags(cpuinfo))
    if native:
        return Precision("mixed_bfloat16", AUTO,
                         f"no GPU; CPU flag {', '.join(native)}: native bfloat16")
    return Precision("float32", AUTO,
                     "no GPU; CPU without avx512_bf16/amx_bf16: bfloat16 would be emulated")


def resolve(requested: str, *, choose: Callable[[], Precision] | None = None) -> Precision:
    """The `Precision` for a config value.

    Args:
      requested: `auto` or a Keras policy name.
      choose: the detection used for `auto` (default: `choose_auto`).
    Returns:
      The resolved `Precision`.
    Raises:
      ValueError: an unknown value.
    """
    if requested == AUTO:
        return (choose or choose_auto)()
    if requested not in POLICIES:
        raise ValueError(f"mixed_precision must be one of {', '.join(CHOICES)}, "
                         f"got {requested!r}")
    return Precision(requested, requested, "set in the config")
