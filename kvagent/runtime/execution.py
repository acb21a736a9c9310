"""How an engine runs, resolved once: the device, the dtype, the decode step's mode, the matmuls'
weight layout and the static step's attention, from what the user asked (`auto` included).

`resolve` is the one place these are decided; the engine holds the result (`Engine.execution`), the
step runner and the commands read it (`describe` is the line a command shows), and a command calls
`resolve` before it reads the model so a setting this machine cannot run fails at once (`kvagent
... --decode-step graph` on a CPU). Which forwards then take the static step is per forward
(step.py's plan), and each that does not says why (step.EAGER_REASONS).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kvagent.errors import ConfigError
from kvagent.runtime import attention_step
from kvagent.runtime import linear as packing
from kvagent.runtime.step import resolve_mode

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(device: str | torch.device) -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device: got {device!r}; use auto, cpu or cuda[:N]")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: CUDA requested but not available; use device='cpu' or 'auto'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(
            f"device: {device} but this machine has {torch.cuda.device_count()} CUDA device(s); "
            f"use cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ConfigError(f"dtype: got {dtype!r}; choose auto, float32, bfloat16 or float16")
    return DTYPES[dtype]


@dataclass(frozen=True)
class Execution:
    device: torch.device
    dtype: torch.dtype
    decode_step: str  # eager | static | compiled | graph
    packs: packing.Packs | None  # the matmuls' packed layout (a CPU), or None: plain weights
    attention: str  # the static step's attention backend: split | sdpa (attention_step.py)

    @property
    def linear(self) -> str:
        return "plain" if self.packs is None else "packed"

    def with_decode_step(self, mode: str) -> Execution:
        """The same engine, decode tokens run another way (benchmarks compare modes on one engine)."""
        return replace(self, decode_step=resolve_mode(mode, self.device))

    def describe(self) -> str:
        step = self.decode_step if self.decode_step == "eager" else f"{self.decode_step} ({self.attention})"
        return f"{self.device.type} {str(self.dtype).removeprefix('torch.')}, decode {step}, linear {self.linear}"


def resolve(
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    decode_step: str = "auto",
    linear: str = "auto",
    attention: str = "auto",
) -> Execution:
    """What the user asked, decided for this machine; a ConfigError naming the setting and the fix
    where it cannot run here."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    mode = resolve_mode(decode_step, dev)
    return Execution(
        device=dev,
        dtype=dt,
        decode_step=mode,
        packs=packing.resolve(linear, dev, dt, mode),
        attention=attention_step.resolve(attention, dev),
    )
