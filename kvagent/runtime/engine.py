"""Engine: a loaded model + tokenizer with kvagent's attention registered; makes Sessions.

With `max_batch > 1` the engine owns a batcher that joins concurrent sessions' forwards (one
session per thread) into shared batches, and slot pools that hold evicting sessions' caches.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from kvagent.errors import ConfigError
from kvagent.runtime import attention, execution, models
from kvagent.runtime import linear as packing
from kvagent.runtime.batcher import PREFILL_BUDGET, Batcher
from kvagent.runtime.config import CacheConfig
from kvagent.runtime.decoder import decoder_for
from kvagent.runtime.execution import Execution
from kvagent.runtime.forward import Chunk, run_forward
from kvagent.runtime.plan import CachePlan
from kvagent.runtime.pool import Slot, SlotPool
from kvagent.runtime.session import Session
from kvagent.runtime.step import StepRunner

PLANS_KEPT = 64  # the prepared plans an engine keeps (`Engine.plan`)


class Engine:
    """Holds the model; `session(config)` starts an episode over a fresh evictable cache."""

    def __init__(
        self,
        model,
        tokenizer,
        execution: Execution,
        backend: str,
        name: str,
        max_batch: int = 1,
        prefill_budget: int | None = PREFILL_BUDGET,
    ):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"max_batch: expected an int >= 1 (1 = no batching), got {max_batch!r}")
        if prefill_budget is not None and (
            isinstance(prefill_budget, bool) or not isinstance(prefill_budget, int) or prefill_budget < 1
        ):
            raise ConfigError(
                f"prefill_budget: expected an int >= 1 (prefill tokens a forward takes beside decode "
                f"tokens) or None (no limit), got {prefill_budget!r}"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.execution = execution  # device, dtype, decode mode, linear: resolved once (execution.py)
        self.device = execution.device
        self.dtype = execution.dtype
        self.backend = backend
        self.name = name
        cfg = model.config
        self.n_layers = int(cfg.num_hidden_layers)
        n_heads = int(cfg.num_attention_heads)
        self.n_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
        self.group_size = n_heads // self.n_kv_heads
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
        self.scaling = _attention_scaling(model, self.head_dim)
        self.max_context = getattr(cfg, "max_position_embeddings", None)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        # What policies may take from the model (BasePolicy.model_args) instead of from the user.
        self.model_facts = {"inv_freq": _rope_inv_freq(model)}
        self.max_batch = max_batch
        self.batcher = Batcher(self, max_batch, prefill_budget=prefill_budget) if max_batch > 1 else None
        self.pools: dict[tuple, SlotPool] = {}
        self._pools_lock = threading.Lock()
        self._plans: OrderedDict[str, CachePlan] = OrderedDict()  # `plan`'s, the newest last
        self._plans_lock = threading.Lock()
        # The one model path (decoder.py) where the architecture has one: every forward, the static
        # step and the eager packed row alike; transformers' modules only for other architectures.
        # It fuses q/k/v and gate/up, so it is built before the weights are packed.
        self.decoder = decoder_for(model, self.scaling)
        # CPU matmuls over oneDNN-packed weights (linear.py): the decoder's own (its `packed` twin),
        # or the modules' where there is no decoder.
        self.packs = execution.packs
        packing.install(model, self.packs if self.decoder is None else None)
        self.model_path = None  # None: transformers' modules
        if self.decoder is not None:
            self.decoder.set_attention(execution.attention, execution.device)
            self.model_path = self.decoder if self.packs is None else self.decoder.packed(self.packs)
        # The static decode step (step.py): its mode, and None where the architecture has none.
        self.step_runner = StepRunner(self)

    @classmethod
    def load(
        cls,
        model,
        tokenizer=None,
        device="auto",
        dtype="auto",
        attn="auto",
        max_batch=1,
        decode_step="auto",
        prefill_budget=PREFILL_BUDGET,
        linear="auto",
    ) -> Engine:
        """`model`: a name (smollm2, tiny-random-qwen3, tiny-random-llama), hub id, local dir,
        .gguf file, or a built PreTrainedModel (then pass its tokenizer). `max_batch > 1`: sessions
        driven from different threads share forwards, up to that many per forward, and a forward takes
        at most `prefill_budget` prompt tokens beside decode tokens (batcher.py). `decode_step`:
        how evicting sessions' decode tokens run (step.py: auto, eager, static, compiled, graph).
        `linear`: auto, packed or plain (linear.py: CPU matmuls over oneDNN-packed weights)."""
        from transformers import AutoTokenizer, PreTrainedModel

        attention.register()
        plan = execution.resolve(device, dtype, decode_step, linear)
        dev, dt = plan.device, plan.dtype
        if isinstance(tokenizer, str):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        if isinstance(model, PreTrainedModel):
            name = getattr(model.config, "_name_or_path", "") or type(model).__name__
            if tokenizer is None:
                raise ConfigError("tokenizer: a built model needs its tokenizer; pass tokenizer=...")
            m, tok = model, tokenizer
        elif isinstance(model, str):
            name = model
            m, tok = models.resolve(model, dt, tokenizer)
        else:
            raise ConfigError(f"model: expected a name, path or PreTrainedModel, got {type(model).__name__}")
        m = m.to(device=dev, dtype=dt).eval()
        m.set_attn_implementation(attention.ATTN_NAME)
        return cls(
            m,
            tok,
            plan,
            attention.resolve_backend(attn, dev),
            name,
            max_batch=max_batch,
            prefill_budget=prefill_budget,
        )

    def session(self, config: CacheConfig | None = None, **kwargs) -> Session:
        """A new episode over a fresh cache of `config` (or of keyword fields), run by this engine's
        plan of it (`plan`)."""
        if config is None:
            config = CacheConfig(**kwargs)
        elif kwargs:
            raise ConfigError("session: pass either a CacheConfig or keyword fields, not both")
        return Session(self, self.plan(config))

    def plan(self, config: CacheConfig) -> CachePlan:
        """The prepared plan of `config` on this engine (plan.py: its policy and Schedule), made once
        per configuration and shared by its sessions and `budget.check_run`; raises the ConfigError
        a session of it would. The last PLANS_KEPT configurations are kept (a server's requests
        may each bring their own seed)."""
        key = repr(config)
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = CachePlan.prepare(config, self.n_layers, self.model_facts, self.max_context)
                self._plans[key] = plan
                if len(self._plans) > PLANS_KEPT:
                    self._plans.popitem(last=False)
            self._plans.move_to_end(key)
        return plan

    def forward(self, chunk: Chunk) -> None:
        """Run one session's chunk: alone on a solo engine, joined with other sessions' pending
        chunks on a batching one. Either way `forward.run_forward` runs it; sets `chunk.logits`."""
        if self.batcher is None:
            run_forward(self, [chunk])
        else:
            self.batcher.forward(chunk)
            if chunk.error is not None:
                raise chunk.error

    def slot_for(self, capacities: tuple[int, ...] | None, buffer: int, window: int = 0) -> Slot | None:
        """A pool slot (its static slab) for a cache of these per-layer capacities, on any engine;
        None for caches without fixed capacities (they stay private). `window`: the W of the ring
        of window queries the slot carries. The caller releases it (`Slot.release`) when its
        session is gone."""
        if capacities is None:
            return None
        key = (tuple(capacities), buffer, window)
        with self._pools_lock:
            if key not in self.pools:
                self.pools[key] = SlotPool(
                    key[0],
                    buffer,
                    self.n_kv_heads,
                    self.head_dim,
                    self.dtype,
                    self.device,
                    self.max_batch,
                    n_q_heads=self.n_kv_heads * self.group_size,
                    window=window,
                )
            pool = self.pools[key]
        slot = pool.acquire()
        # The static step's batches (graphs, compiles) for a new block, made before anything steps.
        self.step_runner.prepare(pool, slot.block)
        return slot

    def load_session(self, path) -> Session:
        """A new session continuing, exactly, the one `Session.save` wrote to `path` with this
        model; another model's, another format version's or a cut-short file is a ConfigError."""
        from kvagent.runtime import persist

        return persist.load(path, self)

    def set_decode_step(self, mode: str) -> None:
        """Switch how decode tokens run (step.py's modes) for every session of this engine, from
        its next forward on; the weights stay as they are (benchmarks compare modes on one set of
        sessions). The blocks in use are prepared for the new mode now (captures, compiles), and
        lose the old mode's batches and graphs."""
        self.execution = self.execution.with_decode_step(mode)
        runner = StepRunner(self)
        with self._pools_lock:
            pools = list(self.pools.values())
        for pool in pools:
            for block in list(pool.blocks):
                for key in [k for k in block.batches if k[0] != runner.key]:
                    del block.batches[key]
                runner.prepare(pool, block)
        self.step_runner = runner

    def set_step_attention(self, backend: str, kv_chunk: int | None = None) -> None:
        """The static step's attention backend (attention_step.py: auto, split, sdpa) for this
        engine's decoders, plain and packed alike (benchmarks and tests compare backends)."""
        for decoder in {id(d): d for d in (self.decoder, self.model_path) if d is not None}.values():
            decoder.set_attention(backend, self.device, kv_chunk)

    def close(self) -> None:
        """Stop the batcher thread (batching engines); sessions of this engine stop working."""
        if self.batcher is not None:
            self.batcher.close()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def _attention_scaling(model, head_dim: int) -> float:
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "scaling"):
            return float(module.scaling)
    return head_dim**-0.5


def _rope_inv_freq(model) -> torch.Tensor | None:
    """The angular frequency of each RoPE pair as the model rotates keys (scaling such as YaRN
    included), from its rotary embedding's `inv_freq` buffer; None without one, or with several
    that differ (e.g. local and global attention layers with different bases)."""
    found = [b for name, b in model.named_buffers() if name.rsplit(".", 1)[-1] == "inv_freq"]
    if not found or any(f.shape != found[0].shape or not torch.equal(f, found[0]) for f in found[1:]):
        return None
    return found[0].detach().to("cpu", torch.float64).clone()


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        e = getattr(src, "eos_token_id", None)
        if e is None:
            continue
        ids.update(e if isinstance(e, list | tuple | set) else [e])
    return {int(i) for i in ids}
