"""CPU matmuls over oneDNN's prepacked weights (`Engine.load(linear=...)`).

On a CPU, `F.linear` hands the plain weight to MKL's sgemm call after call, and for the few rows
of a decode step that costs more than the arithmetic: on the 2-core AVX2 EPYC of
docs/benchmarks.md, SmolLM2's 121 matmuls take 82 ms for 8 rows and 43 ms for one, against 41 and
27 ms with the weights packed once into oneDNN's blocked layout (512 rows: 1.01 against 0.94 s).
vLLM-CPU's x86 GEMM is oneDNN over prepacked weights too.

An engine packs its model path's weights (`Decoder.packed`: the fused q/k/v and gate/up, o, down
and the head, read by the eager forward and the static step alike); `install` gives every
`nn.Linear` a forward over its packed weight (`torch.ops.mkldnn._linear_pointwise`) only for an
architecture without a decoder, whose forwards run transformers' modules. The plain weights stay,
because the compiled step, the oracle and anything that reads `.weight` use them: a packed engine
holds SmolLM2's weights about twice (the embedding and the tied head once each). A packed result row
does not depend on the other rows of the call (here; MKL's does). Weights are read when packed: one
changed after load is not seen.

A packed call costs a fixed 25-35 us more than a plain one, so small weights lose: at 8 rows a
192 x 576 weight takes 48 against 42 us, a 576 x 576 one 85 against 118 us. `auto` packs weights of
`MIN_ELEMENTS` and more, which leaves tiny test models plain.

Modes: `auto` packs float32 on a CPU with oneDNN, and bfloat16 where the CPU has bf16 units
(avx512_bf16 or AMX: on an avx512_bf16 EPYC packed bf16 took 0.76x plain's time for the static
step and for a dense decode step, 0.99x for a 512-token prefill: docs/benchmarks.md); never under
the `compiled` decode step. `packed` packs every weight, small ones too, and bfloat16 on any CPU
that can (AVX-512 or AVX-NE-CONVERT); `plain` is torch's `F.linear`."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from kvagent.errors import ConfigError

MODES = ("auto", "packed", "plain")
MIN_ELEMENTS = 1 << 18  # auto's smallest packed weight (out x in), from the 2-core AVX2 EPYC


def resolve(mode: str, device: torch.device, dtype: torch.dtype, decode_step: str = "static") -> Packs | None:
    """The `Packs` an engine packs its weights through, or None (plain); a mode this machine cannot
    run is a ConfigError. `auto` leaves a `compiled` engine plain: its step cannot trace a packed
    weight, and its prefill then computes as its decode does."""
    if mode not in MODES:
        raise ConfigError(f"linear: got {mode!r}; choose {', '.join(MODES)}")
    usable = device.type == "cpu" and torch.backends.mkldnn.is_available()
    packs_dtype = dtype == torch.float32 or (dtype == torch.bfloat16 and bf16_units())
    auto = usable and packs_dtype and decode_step != "compiled"
    if mode == "plain" or (mode == "auto" and not auto):
        return None
    if not usable:
        raise ConfigError(f"linear: packed is oneDNN's CPU layout, not for {device.type}; use auto or plain")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ConfigError(f"linear: packed takes float32 or bfloat16, not {dtype}; use auto or plain")
    try:
        pack(torch.zeros(8, 8, dtype=dtype))
    except RuntimeError as e:
        if mode == "auto":  # a default never fails a run: plain weights then
            return None
        raise ConfigError(f"linear: this CPU cannot pack {dtype} weights ({e}); use auto or plain") from None
    return Packs(0 if mode == "packed" else MIN_ELEMENTS)


def bf16_units() -> bool:
    """Whether this CPU computes bfloat16 natively (avx512_bf16 or AMX), where `auto` packs bf16."""
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private in torch 2.13; absent: no
    return any(getattr(cpu, name, lambda: False)() for name in checks)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The (out, in) weight in oneDNN's layout: an opaque tensor only `linear` reads."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), over `pack(weight)` where `weight` is packed (what `Packs` gives)."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Packs:
    """Packed weights by the plain tensor they come from, so a weight two readers share (a tied
    head, a module's weight the static step also reads) is packed once; a weight of fewer than
    `min_elements` stays as it is."""

    def __init__(self, min_elements: int = 0) -> None:
        self.min_elements = min_elements
        self._by: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, weight: torch.Tensor) -> torch.Tensor:
        """The packed weight, or `weight` itself where it is too small to pay."""
        if weight.numel() < self.min_elements:
            return weight
        key = (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype)
        if key not in self._by:
            self._by[key] = (weight, pack(weight))  # the plain one held: its address stays its own
        return self._by[key][1]


class PackedForward:
    """An `nn.Linear`'s forward over its packed weight. A deep copy of the module (which cannot copy
    an opaque tensor) packs its own copy's weight on first call."""

    def __init__(self, module: nn.Linear, packed: torch.Tensor | None) -> None:
        self.module, self.packed = module, packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            self.packed = pack(self.module.weight)
        return linear(x, self.packed, self.module.bias)

    def __deepcopy__(self, memo) -> PackedForward:
        return PackedForward(copy.deepcopy(self.module, memo), None)


def install(model: nn.Module, packs: Packs | None) -> int:
    """Every `nn.Linear` of `model` computes over `packs`' weights (those it packs), or (None) plainly
    again: a model takes the setting of the last engine loaded over it. Returns how many modules
    compute over a packed weight."""
    n = 0
    for module in model.modules():
        if type(module) is not nn.Linear:  # subclasses (quantized, LoRA) keep their own forward
            continue
        module.__dict__.pop("forward", None)
        packed = packs(module.weight) if packs is not None else None
        if packed is not None and packed.is_mkldnn:
            module.forward = PackedForward(module, packed)
            n += 1
    return n
