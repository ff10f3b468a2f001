"""What one frame costs a device: the kernels it dispatches, the host syncs it makes, the tensors it allocates.

A GPU pipeline keeps up when its steady-state frame only *enqueues* work. A host sync is the host reading a
value computed on the device. Examples are ``.item()``, ``.tolist()``, ``bool(t)`` and ``.cpu()``. An op whose
output shape depends on the data is one too, such as ``nonzero`` or boolean-mask indexing. A sync makes the CPU
wait for the device. It empties the queue. It cannot be captured into a CUDA graph. An :class:`OpCounter` counts
these, in the thread that uses it:

- ``kernels``: every aten op dispatched that computes. Views and metadata-only ops are left out. In eager torch
  each is one kernel launch on a GPU. A compiled graph fuses several into one. Count those with the profiler.
- ``syncs``: host reads and ops that wait for data. Host reads are
  ``Tensor.item / tolist / numpy / cpu / __bool__ / __int__ / __float__ / __index__`` and ``.to("cpu")``.
  Ops tagged ``data_dependent_output`` count, such as ``aten::_local_scalar_dense`` and ``equal``.
  Ops tagged ``dynamic_output_shape`` count, such as ``nonzero``, ``masked_select`` and ``unique``.
  ``repeat_interleave`` counts only without ``output_size``.
  ``index`` and ``index_put_`` count only with a boolean mask. Integer indices have a static shape.
  ``aten::_linalg_check_errors`` counts. ``torch.linalg.solve`` and kin read their status back to raise.
  Each sync's name goes into ``sync_ops``.
- ``allocations`` / ``allocated_bytes``: op outputs that own new storage. A view or an in-place write does not.

On a CPU every tensor is a host tensor. So the counter cannot tell a read of a device value from a read of
host data. It counts every read. That is the point of running it on a CPU. A steady-state step that reads *no*
tensor value back runs on a GPU without waiting for it.

    counter = OpCounter()
    with counter:
        step()
    counter.counts()   # {"kernels": 212, "syncs": 0, "sync_ops": {}, "allocations": 97, ...}

The function :func:`count_stage_calls` wraps stages of a graph. Each ``process`` call is then counted in the
stage's own worker thread. Torch modes are per thread.
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "StageCalls", "count_stage_calls", "HOST_READS"]

# Tensor methods that hand a value to Python (or to the host) and so wait for the device.
HOST_READS = {
    torch.Tensor.item: "Tensor.item", torch.Tensor.tolist: "Tensor.tolist", torch.Tensor.numpy: "Tensor.numpy",
    torch.Tensor.cpu: "Tensor.cpu", torch.Tensor.__bool__: "Tensor.__bool__", torch.Tensor.__int__: "Tensor.__int__",
    torch.Tensor.__float__: "Tensor.__float__", torch.Tensor.__index__: "Tensor.__index__",
    torch.Tensor.__format__: "Tensor.__format__",
}
_METADATA_OPS = {"aten::detach", "aten::lift_fresh", "aten::alias", "aten::_reshape_alias", "aten::set_",
                 "aten::resize_", "prim::device", "aten::sym_size", "aten::sym_stride", "aten::sym_numel",
                 "aten::sym_storage_offset", "aten::is_same_size"}
_ALLOCATORS = ("aten::empty", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
               "aten::empty_like")
_BOOL_INDEXED = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}
# ops that read a status back to raise an error (linalg's solvers and factorisations check ``info`` on the host)


def _to_host(args, kwargs) -> bool:
    """``Tensor.to`` called with a CPU device. That is the transfer a GPU tensor makes to the host."""
    targets = list(args[1:]) + [kwargs.get("device")]
    return any((isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu") for a in targets if a is not None)


class _Reporting:
    """A torch mode that reports to the :class:`OpCounter` ``owner`` that entered it."""

    def __init__(self, owner: OpCounter):
        super().__init__()
        self.owner = owner


class _Reads(_Reporting, TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = HOST_READS.get(func)
        to_host = func is torch.Tensor.to and args and args[0].device.type != "cpu" and _to_host(args, kwargs)
        if name is None and to_host:
            name = "Tensor.to(cpu)"
        if name is None:
            return func(*args, **kwargs)
        self.owner.sync(name)
        self.owner.quiet += 1  # the aten op under it (_local_scalar_dense...) is the same sync
        try:
            return func(*args, **kwargs)
        finally:
            self.owner.quiet -= 1


class _Ops(_Reporting, TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.owner.dispatched(func, args, kwargs, out)
        return out


def _storages(values) -> set[int]:
    found = set()
    for v in values:
        if isinstance(v, torch.Tensor):
            found.add(v.untyped_storage().data_ptr())
        elif isinstance(v, (list, tuple)):
            found |= _storages(v)
    return found


class OpCounter:
    """Counts kernels, host syncs and allocations of what runs in this thread while it is entered.

    The module docs say what each count holds. Entered again, it adds to its counts. Its :meth:`reset` starts over.
    """

    def __init__(self):
        self.quiet = 0
        self.reset()

    def reset(self) -> None:
        self.kernels = 0
        self.allocations = 0
        self.allocated_bytes = 0
        self.kernel_ops: Counter[str] = Counter()
        self.sync_ops: Counter[str] = Counter()

    @property
    def syncs(self) -> int:
        return sum(self.sync_ops.values())

    def sync(self, name: str) -> None:
        self.sync_ops[name] += 1

    def dispatched(self, func, args, kwargs, out) -> None:
        name = func._schema.name
        if name in _METADATA_OPS or func.is_view:
            return
        tags = func.tags
        dynamic = (torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags
                   or name == "aten::_linalg_check_errors")
        if name in _BOOL_INDEXED:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            dynamic = any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
        if name == "aten::repeat_interleave" and kwargs.get("output_size") is not None:
            dynamic = False
        if dynamic and not self.quiet:
            self.sync(name)
        if not name.startswith(_ALLOCATORS) and name != "aten::_local_scalar_dense":
            self.kernels += 1
            self.kernel_ops[name] += 1
        inputs = _storages(list(args) + list(kwargs.values()))
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.allocations += 1
                self.allocated_bytes += t.untyped_storage().nbytes()

    def counts(self) -> dict:
        return {"kernels": self.kernels, "syncs": self.syncs, "sync_ops": dict(self.sync_ops),
                "allocations": self.allocations, "allocated_bytes": self.allocated_bytes}

    def __enter__(self) -> OpCounter:
        self._modes = (_Reads(self), _Ops(self))
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class StageCalls:
    """The counts of each ``process`` call of one stage, in call order. It is made by :func:`count_stage_calls`."""

    def __init__(self, name: str):
        self.name = name
        self.calls: list[dict] = []
        self._lock = threading.Lock()

    def add(self, counts: dict) -> None:
        with self._lock:
            self.calls.append(counts)

    def steady(self, skip: int) -> list[dict]:
        """The calls after the first ``skip``.

        The skipped ones are the warm-up. First frames allocate state, build tables and compile.
        """
        with self._lock:
            return list(self.calls[skip:])


def count_stage_calls(stages: Iterable) -> dict[str, StageCalls]:
    """Wrap each stage's ``process`` so every call is counted in the stage's worker thread.

    Returns the per-stage :class:`StageCalls` by stage name. The wrapping lives on the instance. Build a new
    graph to run uncounted.
    """
    found = {}
    for stage in stages:
        calls = found[stage.name] = StageCalls(stage.name)
        inner = stage.process

        def process(inputs, out, inner=inner, calls=calls):
            counter = OpCounter()
            try:
                with counter:
                    return inner(inputs, out)
            finally:
                calls.add(counter.counts())

        stage.process = process
    return found
