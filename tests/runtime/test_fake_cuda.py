"""The CUDA code paths on a CPU-only machine: the real runtime on tensors that say they are on CUDA.

No GPU runs this project's tests, so a tensor made without `device=` (torch.arange, torch.tensor from
a list, a CPU generator) meeting a CUDA one would first fail on the GPU. Here every tensor the code
puts on "cuda" is a `OnCuda`: a CPU tensor wrapped in a subclass whose device is cuda:0, so the
code takes its CUDA branches (split attention, pinned SDPA kernels, bf16 wide scores, 64-column
slabs, CUDA-event round clocks) and computes real numbers. Each op is first run by torch's
`FakeTensorMode` on fake copies of its inputs (cuda ones on cuda, the rest on the CPU): fake tensors
propagate devices exactly as the CUDA build does, so an op mixing a CUDA tensor with a CPU one
raises here as it would on the GPU (a 0-dim CPU scalar is allowed there too). Then the op runs on
the CPU tensors inside, and each output is wrapped where its fake twin is on cuda.

Host syncs are recorded, not raised, so a run continues past the eager paths' legitimate ones: a
value read back (`.item()`, `int(t)`, `bool(t)`, `.tolist()`), a device-to-host copy (`.cpu()`), and
ops whose output shape depends on values (a boolean-mask index, nonzero, unique). Host-to-device
copies are recorded apart. The static step and the eviction rounds of token policies are asserted
free of both (the staging buffer's one copy aside); a block policy's round (nexus) reads block
counts back, which this file lists (`NEXUS_ROUND_SYNCS`) rather than fails on.

What it cannot cover: the CUDA graph capture and `torch.compile` of the step (`decode_step="graph"`
runs here as `static`, the same `Decoder.__call__` op by op; the compiled parts are the same
functions uncompiled), flash-attn (not installed here), the kernels' own numerics, torch's CausalBias (a tensor subclass this mode cannot make: a
prefill chunk on a non-empty cache gets the same mask as a bool tensor), pinned memory
(asked for, not given: the CPU build cannot pin), CUDA events (stubbed: a round clock's events
record nothing) and streams. CUDA generators: `torch.Generator(device="cuda")` is a CPU generator
that says it is on cuda, so a generator on the wrong device is caught, but its draws are a CPU's.

The CPU build has no CUDA device guard: `torch._C._ensureCUDADeviceGuardSet()`, which FakeTensorMode
calls for this, installs its fake guard only over an existing one. `_install_cuda_guard` registers a
placeholder first (through libc10's `registerDeviceGuard`) so that call replaces it.
"""

from __future__ import annotations

import ctypes
import os
import traceback
import weakref
from dataclasses import dataclass, field

import pytest
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map

from kvagent.runtime import CacheConfig, Sampling

CUDA = torch.device("cuda", 0)
aten = torch.ops.aten
_GUARD: list = []  # the placeholder guard's ctypes objects, kept alive


def _install_cuda_guard() -> None:
    """Make the CPU build accept tensors whose device is cuda (dispatch opens a device guard)."""
    if torch.cuda.is_available() or _GUARD:
        return
    try:
        with FakeTensorMode():
            torch.empty(2, device="cuda")[0].fill_(1)
        return  # a guard is there already
    except RuntimeError:
        pass
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    register = lib._ZN3c104impl19registerDeviceGuardENS_10DeviceTypeEPKNS0_24DeviceGuardImplInterfaceE
    register.argtypes = [ctypes.c_int8, ctypes.c_void_p]
    # A C++ object whose every virtual method returns 0: _ensureCUDADeviceGuardSet asks only its
    # deviceCount(), and 0 makes it swap in c10's FakeGuardImpl<CUDA>.
    zero = ctypes.CFUNCTYPE(ctypes.c_int8, ctypes.c_void_p)(lambda this: 0)
    vtable = (ctypes.c_void_p * 64)(*([ctypes.cast(zero, ctypes.c_void_p).value] * 64))
    obj = (ctypes.c_void_p * 2)(ctypes.addressof(vtable), None)
    _GUARD.extend((zero, vtable, obj))
    register(1, ctypes.addressof(obj))  # DeviceType::CUDA
    torch._C._ensureCUDADeviceGuardSet()


class OnCuda(torch.Tensor):
    """A CPU tensor (`elem`) that says it lives on cuda:0."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            device=CUDA,
            requires_grad=elem.requires_grad,
        )
        r.elem = elem
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def data_ptr(self) -> int:
        return self.elem.data_ptr()

    def tolist(self):
        mode = torch.utils._python_dispatch._get_current_dispatch_mode()
        if isinstance(mode, FakeCuda):
            mode._note("sync", "Tensor.tolist")
        return self.elem.tolist()

    def __repr__(self) -> str:
        return f"OnCuda({tuple(self.shape)}, {self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise AssertionError(f"{func} on an OnCuda tensor outside FakeCuda")


class CudaGenerator(torch.Generator):
    """What `torch.Generator(device="cuda")` makes under FakeCuda: a CPU generator that says cuda."""

    @property
    def device(self) -> torch.device:
        return CUDA


class _Generator(torch.Generator):
    """`torch.Generator` under the fixture: a CudaGenerator where cuda is asked for."""

    def __new__(cls, device=None):
        if device is not None and torch.device(device).type == "cuda":
            g = CudaGenerator()
            _CUDA_GENERATORS.add(g)
            return g
        return _CPU_GENERATOR()


_CUDA_GENERATORS: weakref.WeakSet = weakref.WeakSet()


def _generator_device(gen: torch.Generator) -> torch.device:
    """Dispatch hands an op a new Python object for its generator: a CudaGenerator is known by
    its state (a CPU generator in the very same state is all but impossible here)."""
    state = gen.get_state()
    return CUDA if any(torch.equal(state, g.get_state()) for g in list(_CUDA_GENERATORS)) else gen.device


_CPU_GENERATOR = torch.Generator
_SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten._unique2.default}


@dataclass
class Event:
    kind: str  # "sync" (a value read back, a D2H copy, a value-dependent shape) or "h2d"
    op: str
    where: str  # the innermost kvagent frame


@dataclass
class FakeCuda(TorchDispatchMode):
    """Runs every op on CPU tensors, after FakeTensorMode checked its devices as CUDA would."""

    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)

    def __enter__(self):
        # A factory on "cuda" initialises CUDA first (torch.cuda._lazy_init), unless a fake mode is
        # active; this mode makes no CUDA memory, so there is nothing to initialise.
        self._lazy_init, torch.cuda._lazy_init = torch.cuda._lazy_init, lambda: None
        # torch.tensor(data, device="cuda") then makes a CPU tensor and moves it through dispatch
        # (as under FakeTensorMode): a host-to-device copy this mode sees.
        self._lift = torch._C._only_lift_cpu_tensors()
        torch._C._set_only_lift_cpu_tensors(True)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.cuda._lazy_init = self._lazy_init
        torch._C._set_only_lift_cpu_tensors(self._lift)
        return super().__exit__(*exc)

    def take(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def _note(self, kind: str, func) -> None:
        where = "?"
        for frame in reversed(traceback.extract_stack()[:-2]):
            if "/kvagent/" in frame.filename:
                where = f"{frame.filename.split('/kvagent/')[-1]}:{frame.lineno} {frame.line}"
                break
        self.events.append(Event(kind, str(func), where))

    def _fake_of(self, x):
        if isinstance(x, OnCuda):
            meta = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
            return self.fake.fake_tensor_converter.from_meta_and_device(self.fake, meta, CUDA)
        if type(x) is torch.Tensor or isinstance(x, torch.nn.Parameter):
            return self.fake.from_tensor(x)
        return x

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        pin = kwargs.pop("pin_memory", None)
        flat = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        on_cuda = any(isinstance(a, OnCuda) for a in flat)
        gen = kwargs.get("generator")
        out_dev = kwargs.get("device")
        # 1. Devices as CUDA propagates them (FakeTensorMode raises on a mix).
        fake_out, dynamic = None, False
        try:
            with self.fake:
                fake_out = func(*tree_map(self._fake_of, args), **tree_map(self._fake_of, kwargs))
        except (DataDependentOutputException, DynamicOutputShapeException):
            dynamic = True
        if gen is not None:
            want = (
                torch.device(out_dev) if out_dev is not None else (CUDA if on_cuda else torch.device("cpu"))
            )
            if want.type != _generator_device(gen).type:
                raise RuntimeError(f"{func}: a {gen.device.type} generator for a {want.type} tensor")
        # 2. Syncs and copies.
        if on_cuda and (dynamic or func in _SYNC_OPS):
            self._note("sync", func)
        moves = func in (aten._to_copy.default, aten.copy_.default, aten.copy.default)
        # A CPU tensor that CUDA accepts beside cuda ones (an index, say) is copied over inside the
        # op: a pageable host-to-device copy, which a CUDA graph capture refuses.
        if on_cuda and not moves and any(type(a) is torch.Tensor and a.dim() > 0 for a in flat):
            self._note("h2d", func)
        if moves and fake_out is not None:
            src = args[1] if func is not aten._to_copy.default else args[0]
            dst = fake_out[0] if isinstance(fake_out, tuple) else fake_out
            if isinstance(src, torch.Tensor):
                if isinstance(src, OnCuda) and dst.device.type == "cpu":
                    self._note("sync", func)
                elif not isinstance(src, OnCuda) and dst.device.type == "cuda" and src.dim() > 0:
                    self._note("h2d", func)
        # 3. The op on the CPU tensors inside.
        unwrap = lambda x: x.elem if isinstance(x, OnCuda) else x  # noqa: E731
        real_kwargs = tree_map(unwrap, kwargs)
        if out_dev is not None:
            real_kwargs["device"] = torch.device("cpu")
        if pin is not None:
            real_kwargs["pin_memory"] = False
        if func is aten._fused_sdp_choice.default:
            return int(SDPBackend.MATH)  # what the CUDA kernels compute, in plain CPU ops
        with _disable_current_modes():
            if func is aten.bmm.dtype:  # CUDA's bf16 x bf16 -> float32 bmm; no CPU kernel
                a, b = (unwrap(t) for t in args[:2])
                out = torch.bmm(a.float(), b.float()).to(args[2])
            else:
                out = func(*tree_map(unwrap, args), **real_kwargs)
        if fake_out is None:  # value-dependent shape: where a cuda input was, the output is cuda
            return tree_map(lambda t: OnCuda(t) if on_cuda and isinstance(t, torch.Tensor) else t, out)
        in_place = func._schema.is_mutable or func in (aten.set_.source_Tensor,)
        if in_place and isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
            return args[0]  # the argument itself (its elem changed)

        def wrap(t, f):
            if isinstance(t, torch.Tensor) and isinstance(f, torch.Tensor) and f.device.type == "cuda":
                return OnCuda(t)
            return t

        if isinstance(out, (tuple, list)):
            return type(out)(wrap(t, f) for t, f in zip(out, fake_out, strict=True))
        return wrap(out, fake_out)


class _Event:
    """torch.cuda.Event's stand-in (the CPU build has none): records nothing, always complete."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, *args) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return 0.0


@pytest.fixture
def fake_cuda(monkeypatch):
    """Yields a started FakeCuda mode with CUDA's host-side runtime stubbed (events, generators)."""
    _install_cuda_guard()
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch, "Generator", _Generator)
    # torch's CausalBias (a tensor subclass) cannot be made under this mode: a chunk on a non-empty
    # cache gets the same lower-right causal mask as a bool tensor on the query's device.
    from kvagent.runtime import attention

    def chunk_mask(q_len, kv_len, device):
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len)

    monkeypatch.setattr(attention, "chunk_mask", chunk_mask)
    mode = FakeCuda()
    with mode:
        yield mode


def _to_cuda(model, dtype) -> None:
    """`model.to(device="cuda", dtype=dtype)` (Module.to would copy an OnCuda's metadata into the
    plain Parameter and lose its CPU tensor): every parameter and buffer replaced, ties kept."""
    moved: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for store, make in ((module._parameters, torch.nn.Parameter), (module._buffers, lambda t: t)):
            for name, t in store.items():
                if t is None:
                    continue
                if id(t) not in moved:
                    to = dtype if t.is_floating_point() else t.dtype
                    with torch.no_grad():
                        moved[id(t)] = make(t.detach().to(device=CUDA, dtype=to))
                    if make is torch.nn.Parameter:
                        moved[id(t)].requires_grad_(False)
                store[name] = moved[id(t)]
    model.eval()


def cuda_engine(mode: FakeCuda, attention: str = "split", max_batch: int = 1, dtype=torch.bfloat16):
    """An Engine on "cuda" (Engine.load's steps; its is_available check cannot pass here), with the
    static step run op by op (what decode_step="graph" captures)."""
    from kvagent.runtime import attention as attn_mod
    from kvagent.runtime import execution
    from kvagent.runtime.engine import Engine
    from kvagent.runtime.models import load_qwen3_tokenizer, tiny_random_model

    with _disable_current_modes():
        model = tiny_random_model("qwen3", vocab_size=512, seed=1)
    attn_mod.register()
    plan = execution.Execution(CUDA, dtype, "static", None, attention)
    _to_cuda(model, dtype)
    model.set_attn_implementation(attn_mod.ATTN_NAME)
    engine = Engine(model, load_qwen3_tokenizer(), plan, "sdpa", "tiny", max_batch=max_batch)
    mode.take()  # the weights' copies to the device
    return engine


def _watch_rounds(session, mode: FakeCuda) -> list[list[Event]]:
    """Each eviction round's events (the evictor's evict_due, wrapped on this session only)."""
    rounds: list[list[Event]] = []
    evict_due = session.evictor.evict_due

    def watched(*args, **kwargs):
        before = mode.take()
        out = evict_due(*args, **kwargs)
        rounds.append(mode.take())
        mode.events[:0] = before
        return out

    session.evictor.evict_due = watched
    return rounds


def test_a_cpu_tensor_meeting_a_cuda_one_fails(fake_cuda):
    """The harness itself: what the GPU would refuse, it refuses; what it allows, it allows."""
    x = torch.zeros(4, device="cuda")
    assert isinstance(x, OnCuda) and x.is_cuda
    with pytest.raises(RuntimeError, match="devices"):
        x + torch.arange(4)  # noqa: B018
    assert isinstance(x + torch.tensor(1.0), OnCuda)  # a 0-dim CPU scalar is allowed on CUDA
    with pytest.raises(RuntimeError, match="generator"):
        torch.rand(4, generator=torch.Generator(), device="cuda")
    int(x.sum())
    assert [e.kind for e in fake_cuda.take()] == ["sync"]


def test_eager_forward_prefill_and_decode(fake_cuda):
    """Decoder.forward (forward.py's packed row) on cuda: a prefill chunk, then decode tokens that
    run eager (decode_step eager), with rounds between them."""
    engine = cuda_engine(fake_cuda)
    engine.set_decode_step("eager")
    s = engine.session(CacheConfig(policy="snapkv", budget=24, buffer=8, protect="sink"))
    logits = s.append(list(range(1, 41)))
    assert isinstance(logits, OnCuda) and logits.shape[-1] == 512
    for t in range(12):
        s.step(5 + t)
    assert s.stats.rounds > 0 and engine.step_runner.steps == 0
    syncs = [e for e in fake_cuda.take() if e.kind == "sync"]
    assert syncs == [], syncs


@pytest.mark.parametrize("attention", ["split", "sdpa"])
def test_static_step_on_cuda(fake_cuda, attention):
    """The static step (Decoder.__call__ through StepRunner) with both backends: no sync, and the
    one host-to-device copy is the staging buffer's."""
    engine = cuda_engine(fake_cuda, attention=attention)
    assert engine.step_runner.decoder.attention == attention
    assert engine.decoder.wide_scores  # bf16 on cuda: bmm(out_dtype=float32)
    s = engine.session(CacheConfig(policy="h2o", budget=24, buffer=8, protect="sink"))
    s.append(list(range(1, 41)))
    fake_cuda.take()
    for t in range(20):
        s.step(5 + t)
        events = fake_cuda.take()
        if not any("evict" in e.where for e in events):  # steps without a round
            assert [(e.kind, e.where.split(" ")[0]) for e in events] == [("h2d", "runtime/step.py:133")]
    assert engine.step_runner.steps >= 20 and s.stats.rounds > 0


# A block policy's round reads block counts back to the host (round.py, nexus.py): recorded here.
NEXUS_ROUND_SYNCS = {
    "runtime/round.py:74",  # build_view: n_protected = int(protected[0, 0].sum().item())
    "runtime/round.py:127",  # _select_blocks: int(ids.max().item()), (~fixed).any()
    "runtime/round.py:131",  # ids[cand] (boolean-mask index)
    "runtime/round.py:132",  # torch.bincount (its length depends on the values)
    "runtime/round.py:134",  # scores[:, :, cand]
    "runtime/round.py:142",  # int(fixed.sum().item())
    "runtime/round.py:150",  # bool((counts == counts.flatten()[0]).all())
    "runtime/round.py:154",  # int(counts.flatten()[0].item())
    "runtime/policies/nexus.py:126",  # nb = int(ids.max().item()) + 1
}


@pytest.mark.parametrize(
    "fields",
    [
        dict(policy="random", budget=24, buffer=8, protect="sink"),
        dict(policy="snapkv", budget=24, buffer=8, protect="sink"),
        dict(policy="h2o", budget=24, buffer=8, protect="sink"),
        dict(policy="nexus", budget=64, buffer=32, protect="sink"),
    ],
    ids=lambda f: f["policy"],
)
def test_eviction_rounds_on_cuda(fake_cuda, fields):
    """Rounds on the slab in place: token policies' rounds make no sync and copy nothing in."""
    engine = cuda_engine(fake_cuda)
    s = engine.session(CacheConfig(**fields))
    rounds = _watch_rounds(s, fake_cuda)
    s.append(list(range(1, 140)))
    for t in range(40):
        s.step(5 + t)
    assert s.stats.rounds >= 2
    where = {e.where.split(" ")[0] for r in rounds for e in r}
    if fields["policy"] == "nexus":
        assert where <= NEXUS_ROUND_SYNCS, where - NEXUS_ROUND_SYNCS
    else:
        assert where == set(), where


def test_generation_on_cuda(fake_cuda):
    """The reply loop: one value read back per token (sampling.py), nothing else outside steps."""
    engine = cuda_engine(fake_cuda)
    s = engine.session(CacheConfig(policy="snapkv", budget=24, buffer=8, protect="sink"))
    s.append(list(range(1, 30)))
    fake_cuda.take()
    for sampling in (Sampling(), Sampling(temperature=1.0, top_p=0.9, seed=1)):
        g = s.generate(4, sampling=sampling)
        syncs = [e.where.split(" ")[0] for e in fake_cuda.take() if e.kind == "sync"]
        assert len(g.ids) == 4 and set(syncs) <= {"runtime/sampling.py:29", "runtime/sampling.py:30"}
