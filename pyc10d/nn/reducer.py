"""The Reducer: gradient buckets, readiness, the all-reduce of each bucket, and rebuilding.

How a backward pass goes:

1. ``prepare_for_backward`` (called by DDP's forward) arms the reducer and, when unused
   parameters are to be found, walks the autograd graph from the outputs to learn which
   parameters this rank will not produce a gradient for.
2. Every parameter carries a ``post_accumulate_grad_hook``. When its gradient has been
   accumulated the hook copies it into its bucket's flat buffer (or finds it already there
   with ``gradient_as_bucket_view``). The first hook also marks the unused parameters ready.
3. A bucket whose last gradient arrived is launched, but only in bucket order: every rank
   must issue the same collectives in the same order, and the gradients of one rank may
   arrive in a different order than another's. Launching is ``all_reduce(async_op=True)``
   (or the registered comm hook), so the reduction runs on the group's progress thread
   while autograd computes the next gradients.
4. When the last bucket is launched, a callback is queued on the autograd engine; it runs
   after backward has finished, waits for every bucket and writes the averages back into
   ``param.grad``.

After the first full iteration the buckets are rebuilt in the order gradients actually
arrived (rank 0's order, broadcast so all ranks agree), so the first bucket to fill is the
first to be reduced.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..collectives import all_reduce, broadcast

_DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024
_DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024

_UNFINISHED_REDUCTION = (
    "Expected to have finished reduction in the prior iteration before starting a new one. "
    "This error indicates that your module has parameters that were not used in producing "
    "loss. You can enable unused parameter detection by passing the keyword argument "
    "`find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by \n"
    "making sure all `forward` function outputs participate in calculating loss. \n"
    "If you already have done the above, then the distributed data parallel module wasn't "
    "able to locate the output tensors in the return value of your module's `forward` "
    "function. Please include the loss function and the structure of the return value of "
    "`forward` of your module when reporting this issue (e.g. list, dict, iterable)."
)


def _compute_bucket_assignment_by_size(
    tensors: Sequence[torch.Tensor],
    bucket_size_limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] | None = None,
    tensor_indices: Sequence[int] | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Group tensor indices into buckets of one dtype and device, each about a size limit.

    Tensors are taken in ``tensor_indices`` order (default: index order). A bucket is closed
    once its bytes reach the current limit of its (dtype, device) group; the limits are used
    in turn and the last repeats, so ``[small, large]`` gives a small first bucket. A tensor
    expecting a sparse gradient gets a bucket of its own. Without ``tensor_indices`` the
    buckets are sorted by their first index; with it (an arrival order) they are kept in the
    order they filled. Returns the buckets and each one's size limit.
    """
    if not bucket_size_limits:
        raise ValueError("bucket_size_limits must not be empty")
    limits = [int(x) for x in bucket_size_limits]
    sparse = list(expect_sparse_gradient or [False] * len(tensors))
    if len(sparse) != len(tensors):
        raise ValueError("expect_sparse_gradient must have one entry per tensor")
    order = list(tensor_indices) if tensor_indices else list(range(len(tensors)))
    result: list[tuple[list[int], int]] = []
    open_buckets: dict[tuple[torch.dtype, torch.device], list[Any]] = {}  # key -> [indices, bytes, limit#]
    for i in order:
        t = tensors[i]
        if sparse[i] or t.is_sparse:
            result.append(([i], limits[0]))
            continue
        state = open_buckets.setdefault((t.dtype, t.device), [[], 0, 0])
        state[0].append(i)
        state[1] += t.numel() * t.element_size()
        limit = limits[min(state[2], len(limits) - 1)]
        if state[1] >= limit:
            result.append((state[0], limit))
            state[0], state[1], state[2] = [], 0, state[2] + 1
    for indices, _, nth in open_buckets.values():
        if indices:
            result.append((indices, limits[min(nth, len(limits) - 1)]))
    if not tensor_indices:
        result.sort(key=lambda b: b[0][0])
    return [b[0] for b in result], [b[1] for b in result]


compute_bucket_assignment_by_size = _compute_bucket_assignment_by_size


class GradBucket:
    """What a communication hook sees of one bucket (torch's ``dist.GradBucket``)."""

    def __init__(self, index: int, bucket: _Bucket, is_last: bool) -> None:
        self._index = index
        self._bucket = bucket
        self._is_last = is_last

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flattened gradients (for a sparse bucket, the sparse gradient itself)."""
        return self._bucket.buffer if self._bucket.dense else self._bucket.sparse_grad

    def gradients(self) -> list[torch.Tensor]:
        """One tensor per parameter, each a view into :meth:`buffer` for dense buckets."""
        return list(self._bucket.views) if self._bucket.dense else [self._bucket.sparse_grad]

    def parameters(self) -> list[torch.Tensor]:
        return list(self._bucket.params)

    def is_last(self) -> bool:
        return self._is_last

    def set_buffer(self, tensor: torch.Tensor) -> None:
        """Replace the bucket's contents (the gradient views see the new values)."""
        if self._bucket.dense:
            self._bucket.buffer.copy_(tensor.reshape(-1))
        else:
            self._bucket.sparse_grad = tensor


@dataclass(eq=False, repr=False)
class _Bucket:
    """One bucket: parameters of one dtype and device and their flat gradient buffer."""

    indices: list[int]
    params: list[torch.Tensor]
    dense: bool
    size_limit: int
    buffer: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    views: list[torch.Tensor] = field(default_factory=list)
    sparse_grad: Any = None
    pending: int = 0
    future: Any = None
    is_default: bool = True  # reduced without a comm hook: the result still needs averaging

    def __post_init__(self) -> None:
        if not self.dense:
            return
        total = sum(p.numel() for p in self.params)
        p0 = self.params[0]
        self.buffer = torch.zeros(total, dtype=p0.dtype, device=p0.device)
        offset = 0
        for p in self.params:
            self.views.append(self.buffer[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()


def _is_view_of(grad: torch.Tensor | None, view: torch.Tensor) -> bool:
    return grad is not None and grad.data_ptr() == view.data_ptr() and grad.shape == view.shape


def find_output_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a forward's return value (nested lists, tuples, dicts, dataclasses)."""
    found: list[torch.Tensor] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif hasattr(x, "__dataclass_fields__"):
            stack.extend(getattr(x, f) for f in x.__dataclass_fields__)
    return found


def _reachable_parameters(outputs: Iterable[torch.Tensor], index_of: dict[int, int]) -> set[int]:
    """Indices of the parameters whose gradients a backward from ``outputs`` would produce."""
    used: set[int] = set()
    seen: set[Any] = set()
    stack = []
    for t in outputs:
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad and id(t) in index_of:
            used.add(index_of[id(t)])
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None and id(var) in index_of:
            used.add(index_of[id(var)])
        for nxt, _ in fn.next_functions:
            if nxt is not None and nxt not in seen:
                stack.append(nxt)
    return used


class Reducer:
    """Averages gradients across a process group, bucket by bucket, during backward.

    ``bucket_indices`` lists the parameter indices of each bucket, in the order buckets are
    expected to fill (so the last layer's parameters usually come first). Each bucket must
    hold a single dtype and device.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        bucket_indices: Sequence[Sequence[int]],
        per_bucket_size_limits: Sequence[int],
        process_group: Any,
        expect_sparse_gradients: Sequence[bool] | None = None,
        bucket_bytes_cap: int = _DEFAULT_BUCKET_BYTES,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
        param_to_name_mapping: dict[int, str] | None = None,
        first_bucket_bytes_cap: int = _DEFAULT_FIRST_BUCKET_BYTES,
    ) -> None:
        self.params = list(params)
        self.process_group = process_group
        self.expect_sparse = list(expect_sparse_gradients or [False] * len(self.params))
        self.bucket_bytes_cap = int(bucket_bytes_cap)
        self.first_bucket_bytes_cap = int(first_bucket_bytes_cap)
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.param_names = dict(param_to_name_mapping or {})
        self.static_graph = False
        self._index_of = {id(p): i for i, p in enumerate(self.params)}
        self._world_size = process_group.size()
        self._comm_hook: Callable[[Any, GradBucket], torch.futures.Future] | None = None
        self._comm_hook_state: Any = None
        self.buckets: list[_Bucket] = []
        self._bucket_of: list[tuple[int, int]] = []  # param index -> (bucket, position)
        self._build_buckets(bucket_indices, per_bucket_size_limits)
        # per-iteration state
        self._expect_hooks = False
        self._require_finalize = False
        self._ready = [False] * len(self.params)
        self._next_bucket = 0
        self._unused: list[int] = []
        self._marked_unused = True
        self._finalize_queued = False
        self._local_used: torch.Tensor | None = None
        self._used_work: Any = None
        self._arrival: list[int] = []
        self._has_rebuilt = False
        self.num_iterations = 0
        self._lock = threading.Lock()
        self.num_backward_calls = 0
        self._handles = [
            p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(self.params)
        ]

    # ----------------------------------------------------------------- buckets
    def _build_buckets(self, bucket_indices: Sequence[Sequence[int]], limits: Sequence[int]) -> None:
        placed = [False] * len(self.params)
        buckets: list[_Bucket] = []
        bucket_of: list[tuple[int, int]] = [(-1, -1)] * len(self.params)
        for b, indices in enumerate(bucket_indices):
            if not indices:
                raise RuntimeError("Empty bucket specified.")
            members = [self.params[i] for i in indices]
            sparse = [self.expect_sparse[i] for i in indices]
            if any(sparse) and len(indices) > 1:
                raise RuntimeError("Buckets with sparse gradients must contain a single parameter.")
            first = members[0]
            for i, p in zip(indices, members):
                if placed[i]:
                    raise RuntimeError(f"Parameter {i} is assigned to more than one bucket.")
                placed[i] = True
                if p.dtype != first.dtype:
                    raise RuntimeError(
                        "All parameters in a bucket must have the same dtype; bucket "
                        f"{b} mixes {first.dtype} and {p.dtype}."
                    )
                if p.device != first.device:
                    raise RuntimeError(
                        "All parameters in a bucket must be on the same device; bucket "
                        f"{b} mixes {first.device} and {p.device}."
                    )
            limit = int(limits[b]) if b < len(limits) else self.bucket_bytes_cap
            bucket = _Bucket(list(indices), members, dense=not sparse[0], size_limit=limit)
            for pos, i in enumerate(indices):
                bucket_of[i] = (b, pos)
            if bucket.dense and self.gradient_as_bucket_view:
                for p, view in zip(members, bucket.views):
                    if p.grad is not None and not p.grad.is_sparse:
                        view.copy_(p.grad)
                        p.grad = view
            buckets.append(bucket)
        missing = [i for i, ok in enumerate(placed) if not ok]
        if missing:
            raise RuntimeError(f"Parameters {missing} are not assigned to any bucket.")
        self.buckets, self._bucket_of = buckets, bucket_of

    def _rebuild_buckets(self) -> bool:
        """Called before each forward: fail on an unfinished reduction, else rebuild once.

        The new buckets follow rank 0's gradient arrival order of the last iteration, with
        ``[first_bucket_bytes_cap, bucket_bytes_cap]`` as size limits.
        """
        self._ensure_prior_reduction_finished()
        rebuildable = (self.static_graph or not self.find_unused_parameters) and not self._has_rebuilt
        if not rebuildable or len(self._arrival) != len(self.params):
            return False
        self._has_rebuilt = True
        order = torch.tensor(self._arrival, dtype=torch.int64)
        if self._world_size > 1:
            broadcast(order, group=self.process_group, group_src=0)
        first = min(self.first_bucket_bytes_cap, self.bucket_bytes_cap)
        indices, limits = _compute_bucket_assignment_by_size(
            self.params, [first, self.bucket_bytes_cap], self.expect_sparse, order.tolist()
        )
        self._build_buckets(indices, limits)
        self._arrival = []
        return True

    def _ensure_prior_reduction_finished(self) -> None:
        if not self._require_finalize:
            return
        missing = [i for i, ok in enumerate(self._ready) if not ok]
        names = [self.param_names[i] for i in missing if i in self.param_names]
        msg = (
            f"{_UNFINISHED_REDUCTION}\nParameter indices which did not receive grad for rank "
            f"{self.process_group.rank()}: {' '.join(map(str, missing))}"
        )
        if names:
            msg += f"\nParameters which did not receive grad for rank {self.process_group.rank()}: {', '.join(names)}"
        raise RuntimeError(msg)

    # ----------------------------------------------------------------- iteration
    def prepare_for_forward(self) -> None:
        self.num_iterations += 1

    def prepare_for_backward(self, outputs: Any = None) -> None:
        """Arm the hooks for the coming backward; find unused parameters if asked to."""
        self._expect_hooks = True
        self._ready = [False] * len(self.params)
        for b in self.buckets:
            b.pending = len(b.indices)
            b.future = None
        self._next_bucket = 0
        self._finalize_queued = False
        self._arrival = [] if not self._has_rebuilt else self._arrival
        self._unused = []
        self._marked_unused = True
        if self.find_unused_parameters or self.static_graph:
            tensors = find_output_tensors(outputs)
            used = _reachable_parameters(tensors, self._index_of)
            self._unused = [i for i in range(len(self.params)) if i not in used]
            self._local_used = torch.zeros(len(self.params), dtype=torch.int32)
            if used:
                self._local_used[sorted(used)] = 1
            self._marked_unused = False

    def skip_sync(self) -> None:
        """This iteration's backward accumulates locally (``no_sync`` or an unarmed reducer)."""
        self._expect_hooks = False

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        ref = weakref.ref(self)

        def hook(_param: torch.Tensor) -> None:
            reducer = ref()
            if reducer is not None:
                reducer.on_grad_ready(index)

        return hook

    def on_grad_ready(self, index: int) -> None:
        """Parameter ``index``'s gradient is ready (its hook calls this): counted when this
        iteration's backward synchronises, else ignored (``skip_sync``)."""
        if not self._expect_hooks:
            return
        # Autograd may run hooks on several device threads (CUDA); bucket state is shared.
        with self._lock:
            self._on_grad_ready_locked(index)

    def _on_grad_ready_locked(self, index: int) -> None:
        if not self._marked_unused:
            self._marked_unused = True
            self.num_backward_calls += 1
            assert self._local_used is not None
            self._used_work = all_reduce(self._local_used, group=self.process_group, async_op=True)
            for i in self._unused:
                self._mark_ready(i)
        self._mark_ready(index)

    def _mark_ready(self, index: int) -> None:
        if self._ready[index]:
            name = self.param_names.get(index, "")
            raise RuntimeError(
                f"Expected to mark a variable ready only once. Parameter {index} {name} has been "
                "marked as ready twice. This happens when a parameter takes part in more than one "
                "backward pass of an iteration (reentrant backward, or several forward outputs "
                "backpropagated separately)."
            )
        self._ready[index] = True
        self._require_finalize = True
        if not self._has_rebuilt:
            self._arrival.append(index)
        b, pos = self._bucket_of[index]
        bucket = self.buckets[b]
        param = self.params[index]
        grad = param.grad
        if bucket.dense:
            view = bucket.views[pos]
            if grad is None:
                view.zero_()
            elif not _is_view_of(grad, view):
                view.copy_(grad.to_dense() if grad.is_sparse else grad)
                if self.gradient_as_bucket_view:
                    param.grad = view
        else:
            bucket.sparse_grad = grad if grad is not None else torch.zeros_like(param).to_sparse()
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].pending == 0:
            index = self._next_bucket
            self._next_bucket += 1
            self._launch(index, self.buckets[index])
        if self._next_bucket == len(self.buckets) and not self._finalize_queued:
            self._finalize_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize_backward)

    def _launch(self, index: int, bucket: _Bucket) -> None:
        if self._comm_hook is not None:
            grad_bucket = GradBucket(index, bucket, index == len(self.buckets) - 1)
            fut = self._comm_hook(self._comm_hook_state, grad_bucket)
            if not isinstance(fut, torch._C.Future):  # what Future.then returns; torch.futures.Future subclasses it
                raise RuntimeError(
                    f"callback must return a torch.futures.Future object, but got {type(fut)}"
                )
            bucket.future, bucket.is_default = fut, False
            return
        bucket.is_default = True
        if bucket.dense:
            # Dividing before the sum keeps half-precision sums in range, as torch does.
            bucket.buffer.div_(self._world_size)
            target = bucket.buffer
        else:
            target = bucket.sparse_grad
        bucket.future = all_reduce(target, group=self.process_group, async_op=True).get_future()

    def _finalize_backward(self) -> None:
        """Runs after backward: wait for every bucket and write the results into ``.grad``."""
        self._expect_hooks = False
        self._require_finalize = False
        used: list[int] | None = None
        if self._used_work is not None:
            self._used_work.wait()
            assert self._local_used is not None
            used = self._local_used.tolist()
            self._used_work = None
        for bucket in self.buckets:
            value = bucket.future.wait()
            result = value[0] if isinstance(value, (list, tuple)) else value
            bucket.future = None
            if bucket.dense:
                if not _is_view_of(result, bucket.buffer):
                    bucket.buffer.copy_(result.reshape(-1))
                for i, param, view in zip(bucket.indices, bucket.params, bucket.views):
                    if used is not None and used[i] == 0:
                        continue  # globally unused: leave .grad alone
                    if self.gradient_as_bucket_view:
                        if not _is_view_of(param.grad, view):
                            param.grad = view
                    elif param.grad is None:
                        param.grad = view.clone()
                    else:
                        param.grad.copy_(view)
            else:
                i, param = bucket.indices[0], bucket.params[0]
                if used is not None and used[i] == 0:
                    continue
                if bucket.is_default:
                    result = result / self._world_size
                param.grad = result

    # ----------------------------------------------------------------- hooks, misc
    def register_comm_hook(self, state: Any, hook: Callable[[Any, GradBucket], torch.futures.Future]) -> None:
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self._comm_hook, self._comm_hook_state = hook, state

    def _set_static_graph(self) -> None:
        self.static_graph = True

    def _bucket_param_indices(self) -> list[list[int]]:
        """Current bucket layout (parameter indices per bucket), for tests and logging."""
        return [list(b.indices) for b in self.buckets]

    def _remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __del__(self) -> None:
        try:
            self._remove_hooks()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

