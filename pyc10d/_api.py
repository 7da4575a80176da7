"""pyc10d's public API, gathered from its layers: ``pyc10d/__init__.py`` re-exports
everything in ``__all__`` (at import, or on first use in ``python -m pyc10d.run``'s own
process, which needs none of it: see ``pyc10d.__init__``)."""

from __future__ import annotations

from . import constants, device_mesh, distributed_c10d, functional, nn
from .backends import Work
from .collectives import (
    _all_gather_base,
    _broadcast_coalesced,
    _reduce_scatter_base,
    all_gather,
    all_gather_coalesced,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    gather_into_tensor,
    gather_single,
    monitored_barrier,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
    supports_complex,
)
from .constants import default_pg_timeout, reduce_op
from .device_mesh import DeviceMesh, init_device_mesh
from .errors import (
    DistBackendError,
    DistError,
    DistInputError,
    DistNetworkError,
    DistStoreError,
    DistTimeoutError,
    QueueEmptyError,
)
from .groups import (
    _abort_process_group,
    _get_default_group,
    _get_default_store,
    _new_group_with_tag,
    _rank_not_in_group,
    abort_process_group,
    destroy_process_group,
    get_backend,
    get_backend_config,
    get_backend_impl,
    get_default_backend_for_device,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_pg_count,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_backend_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    is_xccl_available,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    set_timeout,
    split_group,
)
from .nn import _DEFAULT_FIRST_BUCKET_BYTES, GradBucket, Reducer, _compute_bucket_assignment_by_size
from .nn.comm_hooks import BuiltinCommHookType
from .object_collectives import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .process_group import Backend, ProcessGroup, ProcessGroupGloo, _round_robin_process_groups
from .reconfigure import _get_reconfigure_handle, _reconfigure, _supports_reconfigure
from .rendezvous import register_rendezvous_handler
from .shrink import shrink_group
from .store import FileStore, HashStore, PrefixStore, Store, TCPStore
from .types import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    _make_premul_sum,
)
from .window import _new_window, _supports_window
from .world import GroupMember, group

__all__ = [
    "AllToAllOptions", "AllgatherOptions", "AllreduceCoalescedOptions", "AllreduceOptions", "Backend",
    "BarrierOptions", "BroadcastOptions", "DeviceMesh", "GradBucket", "Reducer", "nn",
    "_DEFAULT_FIRST_BUCKET_BYTES", "_compute_bucket_assignment_by_size", "device_mesh", "functional", "init_device_mesh", "DistBackendError", "DistError", "DistInputError", "DistNetworkError",
    "DistStoreError", "DistTimeoutError", "FileStore", "GatherOptions", "GroupMember", "HashStore",
    "P2POp", "PrefixStore", "ProcessGroup", "ProcessGroupGloo", "ReduceOp", "ReduceOptions",
    "ReduceScatterOptions", "ScatterOptions", "Store", "TCPStore", "Work", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_object", "all_reduce",
    "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv",
    "abort_process_group", "_abort_process_group",
    "broadcast", "broadcast_object_list", "destroy_process_group", "distributed_c10d", "gather",
    "gather_object", "get_backend", "get_global_rank", "get_group_rank", "get_node_local_rank", "get_pg_count",
    "get_process_group_ranks", "get_rank", "get_world_size", "group", "init_process_group",
    "irecv", "is_available", "is_gloo_available", "is_initialized", "is_mpi_available",
    "is_nccl_available", "is_torchelastic_launched", "is_ucc_available", "isend",
    "monitored_barrier", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "recv",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
    "_all_gather_base", "_broadcast_coalesced", "_get_default_group", "_get_default_store",
    "_make_premul_sum", "_new_group_with_tag", "_rank_not_in_group", "_reduce_scatter_base",
    "_round_robin_process_groups", "constants", "default_pg_timeout", "reduce_op",
    "all_gather_single", "reduce_scatter_single", "supports_complex", "get_backend_config",
    "get_default_backend_for_device", "is_backend_available", "split_group", "send_object_list",
    "recv_object_list", "register_rendezvous_handler", "QueueEmptyError", "BuiltinCommHookType",
    "is_xccl_available", "shrink_group", "gather_single", "gather_into_tensor", "get_backend_impl",
    "set_timeout", "_get_reconfigure_handle", "_reconfigure", "_supports_reconfigure", "_new_window",
    "_supports_window",
]
