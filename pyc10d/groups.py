"""Initialisation and groups: ``init_process_group``, ``new_group``, rank queries, ``destroy``."""

from __future__ import annotations

import hashlib
import os
import warnings
from datetime import timedelta
from typing import Any

import torch

from .backends import Engine, Options
from .launch_env import local_rank as _launcher_local_rank
from .process_group import Backend, ProcessGroup, make_engine
from .rendezvous import rendezvous
from .store import PrefixStore, Store
from .types import DEFAULT_TIMEOUT
from .world import NonGroupMember, current_world, ensure_thread_world

__all__ = [
    "init_process_group", "destroy_process_group", "abort_process_group", "_abort_process_group", "is_initialized", "get_rank", "get_world_size",
    "get_backend", "new_group", "new_subgroups", "new_subgroups_by_enumeration",
    "get_process_group_ranks", "get_group_rank", "get_global_rank", "_get_default_group",
    "_get_default_store", "_rank_not_in_group", "_get_group_tag", "_find_pg_by_ranks_and_tag",
    "_find_or_create_pg_by_ranks_and_tag", "is_available", "is_gloo_available",
    "is_nccl_available", "is_mpi_available", "is_torchelastic_launched", "get_pg_count",
    "get_node_local_rank", "is_xccl_available", "split_group", "get_backend_config", "get_backend_impl", "set_timeout", "is_backend_available",
    "get_default_backend_for_device",
]


def is_available() -> bool:
    return True


def is_gloo_available() -> bool:
    return True


def is_nccl_available() -> bool:
    return False


def is_mpi_available() -> bool:
    return False


def is_ucc_available() -> bool:
    return False


def is_xccl_available() -> bool:
    return False


def is_backend_available(backend: str) -> bool:
    """``backend`` names one ``init_process_group`` can build here: a built-in one (``gloo``
    is ``tcp``), ``auto``/``undefined`` (the default), or a registered plugin."""
    key = str(backend).lower()
    return key in Backend.backend_list or key in Backend._plugins


def get_default_backend_for_device(device: str | torch.device) -> str:
    """The backend ``init_process_group`` uses for ``device`` when given none: ``auto`` for
    CPU and CUDA tensors alike (a CUDA tensor is staged through host memory)."""
    kind = torch.device(device).type  # a malformed name raises here, as in torch
    try:
        return Backend.default_device_backend_map[kind]
    except KeyError:
        raise ValueError(f"Default backend not registered for device : {device}") from None


def get_backend_config(group: Any = None) -> str:
    """``"cpu:<backend>,cuda:<backend>"`` (torch's spelling): one engine serves both."""
    name = get_backend(group)
    return f"cpu:{name},cuda:{name}"


def is_torchelastic_launched() -> bool:
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank among those of its host, as its launcher numbered them.

    torch reads ``LOCAL_RANK``; pyc10d also reads the local rank of Open MPI, MPICH and
    Slurm, so scripts started by ``mpirun`` or ``srun`` pick their device the same way.
    """
    found = _launcher_local_rank(os.environ)
    if found is not None:
        return found
    if fallback_rank is not None:
        return fallback_rank
    raise RuntimeError(
        "LOCAL_RANK is not in the environment (nor a launcher's local rank). Consider passing "
        "fallback_rank to allow `get_node_local_rank` to work, assuming you are not running "
        "in a multi-device context and want the code to run locally instead."
    )


def is_initialized() -> bool:
    return current_world().default_pg is not None


def _get_default_group() -> ProcessGroup:
    pg = current_world().default_pg
    if pg is None:
        raise ValueError(
            "Default process group has not been initialized, please make sure to call init_process_group."
        )
    return pg


def _get_default_store() -> Store:
    _get_default_group()
    return current_world().default_store


def _as_timeout(timeout: Any) -> timedelta:
    if timeout is None:
        return DEFAULT_TIMEOUT
    if isinstance(timeout, (int, float)):
        return timedelta(seconds=timeout)
    if not isinstance(timeout, timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {type(timeout)}")
    return timeout


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Store | None = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
    enable_reconfigure: bool = False,
) -> None:
    """Create the default group: rendezvous, then connect every rank (``backend`` tcp/gloo/...).

    With ``backend="threaded"`` the calling thread is one rank and gets its own World.
    ``enable_reconfigure`` (torch 2.14's) is accepted: every pyc10d group can be re-formed
    (``reconfigure.py``), and, unlike Gloo's, is usable before its first reconfigure.
    """
    world = ensure_thread_world() if Backend.resolve(backend) == Backend.THREADED else current_world()
    if world.default_pg is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if store is not None and init_method is not None:
        raise ValueError("Cannot specify both init_method and store.")
    timeout = _as_timeout(timeout if timeout is not None else getattr(pg_options, "_timeout", None))
    if store is not None:
        if world_size <= 0:
            raise ValueError("world_size must be positive if using store")
        if rank < 0:
            raise ValueError("rank must be non-negative if using store")
    else:
        store, rank, world_size = rendezvous(init_method or "env://", rank, world_size, timeout)
        store.set_timeout(timeout)
    if not 0 <= rank < world_size:
        raise ValueError(f"init_process_group: rank {rank} is out of range for world_size {world_size}")
    name = group_name or "0"
    backend_name = str(backend).lower() if backend else "auto"
    group_store = PrefixStore(f"{name}/", store)
    engine = make_engine(backend_name, group_store, rank, world_size, timeout, name)
    if backend_name == "auto":  # report (and let new_group reuse) what "auto" chose
        backend_name = getattr(engine, "backend_name", "tcp")
    pg = engine if isinstance(engine, ProcessGroup) else ProcessGroup(
        rank, world_size, engine=engine, group_name=name, backend_name=backend_name
    )
    pg.set_group_store(group_store)
    if isinstance(pg, ProcessGroup):
        pg.requested_backend = str(backend).lower() if backend else "auto"
    world.default_pg = pg
    world.default_store = store
    _watch(engine, store)
    world.backend_name = backend_name
    world.timeout = timeout
    world.group_count = 1
    world.register(pg, name, list(range(world_size)), backend_name, "ptd:" + name)


def _hashed_name(ranks: list[int]) -> str:
    world = current_world()
    name = hashlib.sha1("_".join(map(str, ranks)).encode()).hexdigest()
    while name in world.pg_names.values():
        name = hashlib.sha1((name + "_").encode()).hexdigest()
    return name


def new_group(
    ranks: list[int] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
) -> Any:
    """A group of some ranks of the world. Every rank calls it, unless ``use_local_synchronization``."""
    return _new_group_with_tag(ranks, timeout, backend, pg_options, None, use_local_synchronization, group_desc)


def _new_group_with_tag(
    ranks: list[int] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    pg_tag: str | None = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
) -> Any:
    world = current_world()
    default = _get_default_group()
    world_size, global_rank = default.size(), default.rank()
    ranks = sorted(ranks) if ranks else list(range(world_size))
    for r in ranks:
        if r < 0 or r >= world_size:
            raise ValueError(f"new_group: invalid rank {r}: ranks must be in [0, {world_size})")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"new_group: duplicate ranks in {ranks}")
    user_tag = f"user:{pg_tag}" if pg_tag and not pg_tag.startswith(("user:", "ptd:")) else pg_tag
    if user_tag:
        # The same tag and ranks give the same group (torch's rule). Such a group is named from
        # its tag and ranks, not the counter: ranks may create it in different numbers (only
        # the members do, in _find_or_create_pg_by_ranks_and_tag) without the names drifting.
        existing = _lookup_tagged(world, user_tag, ranks, members_only=False)
        if existing is not None:
            return existing
    if use_local_synchronization:
        if global_rank not in ranks:
            return None
        name = _hashed_name(ranks)
    elif user_tag:
        name = "tag-" + hashlib.sha1(f"{user_tag}|{ranks}".encode()).hexdigest()[:16]
    else:
        name = str(world.group_count)
        world.group_count += 1
    backend_name = str(backend).lower() if backend else world.backend_name
    tag = user_tag or f"ptd:{name}"
    if global_rank not in ranks:
        sentinel = NonGroupMember()
        world.register(sentinel, name, ranks, backend_name, tag)
        return sentinel  # equal to GroupMember.NON_GROUP_MEMBER, registered with its ranks
    return _make_group(ranks, name, backend_name, timeout, pg_options, group_desc, tag)


def _make_group(ranks: list[int], name: str, backend_name: str, timeout: timedelta | None, pg_options: Any,
                group_desc: str | None, tag: str) -> ProcessGroup:
    """Build and register the group of the global ``ranks``, this rank among them. Only its
    members take part: on the world's backend the engine derives from the world's (no new
    connection), on another one it rendezvouses under the group's name."""
    world = current_world()
    if timeout is None:
        timeout = getattr(pg_options, "_timeout", None) or world.timeout
    timeout = _as_timeout(timeout)
    default = _get_default_group()
    group_rank = ranks.index(default.rank())
    world_engine = default._get_backend()
    group_store = PrefixStore(f"{name}/", world.default_store)
    if isinstance(world_engine, Engine) and Backend.resolve(backend_name) == Backend.resolve(world.backend_name):
        options = Options(timeout)
        engine = world_engine.derive(ranks, group_rank, name, options)
    else:
        engine = make_engine(backend_name, group_store, group_rank, len(ranks), timeout, name)
    if pg_options is not None and hasattr(engine, "options"):
        engine.options = Options.of(pg_options)
        engine.options._timeout = timeout
    pg = engine if isinstance(engine, ProcessGroup) else ProcessGroup(
        group_rank, len(ranks), engine=engine, group_name=name, ranks=ranks, backend_name=backend_name
    )
    if group_desc:
        pg.group_desc = group_desc
    pg.set_group_store(group_store)
    _watch(engine, world.default_store)
    world.register(pg, name, ranks, backend_name, tag)
    return pg


def split_group(
    parent_pg: ProcessGroup | None = None,
    split_ranks: list[list[int]] | None = None,
    timeout: timedelta | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: str | None = None,
) -> ProcessGroup | None:
    """Split ``parent_pg`` (default: the world) into the disjoint groups ``split_ranks``,
    lists of ranks *of the parent*. Every member of the parent calls it with the same
    splits; a rank gets the group of its split, or None when it is in none.

    torch does this for NCCL only (a communicator split); here every backend can, at no
    cost in messages: each member derives its group from the world's engine, and the name
    (which keys the group's channels on shared connections) comes from the parent's name
    and how many splits of that parent came before, which all its members count alike.
    """
    world = current_world()
    parent = _resolve(parent_pg)
    if _rank_not_in_group(parent) or parent not in world.pg_names:
        raise ValueError("split_group: this rank is not a member of parent_pg")
    if split_ranks is None:
        raise ValueError("split_group: split_ranks must be given (a list of lists of the parent's ranks)")
    size, seen = parent.size(), set()
    for split in split_ranks:
        for r in split:
            if not 0 <= r < size:
                raise ValueError(f"split_group: rank {r} of {split_ranks} is not a rank of the parent "
                                 f"group (size {size})")
            if r in seen:
                raise ValueError(f"split_group: rank {r} is in more than one split of {split_ranks}")
            seen.add(r)
    parent_backend = world.pg_backend.get(parent, world.backend_name or "undefined")
    if backend is not None and Backend.resolve(backend) != Backend.resolve(parent_backend):
        raise ValueError(f"split_group: backend {backend!r} is not the parent group's ({parent_backend})")
    parent_name = world.pg_names[parent]
    count = world.split_counts.get(parent_name, 0)
    world.split_counts[parent_name] = count + 1
    me = parent.rank()
    index, mine = next(((i, sorted(s)) for i, s in enumerate(split_ranks) if me in s), (-1, None))
    if mine is None:
        return None
    ranks = [get_global_rank(parent, r) for r in mine]
    name = f"{parent_name}.split{count}.{index}"
    return _make_group(ranks, name, parent_backend, timeout, pg_options, group_desc, f"ptd:{name}")


def _watch(engine: Any, store: Store) -> None:
    """Let the watchdog see this group's progress (pyc10d engines; a plugin's may not)."""
    if isinstance(engine, Engine) and store is not None and engine.backend_name != "fake":
        engine.attach_progress_store(store)


def _lookup_tagged(world: Any, tag: str, ranks: list[int], members_only: bool) -> Any:
    """The group registered under ``tag`` whose ranks are exactly ``ranks`` (non-member
    sentinels included unless ``members_only``), or None."""
    want = sorted(ranks)
    for pg in world.tags_to_pg.get(tag, []):
        if members_only and isinstance(pg, NonGroupMember):
            continue
        if sorted(world.pg_group_ranks.get(pg, {})) == want:
            return pg
    return None


def _get_group_tag(pg: Any) -> str:
    """The tag ``pg`` was created with (``user:`` stripped), or its ``ptd:<name>`` default."""
    tag = current_world().pg_tags.get(_resolve(pg))
    if tag is None:
        raise ValueError(f"Group {pg} is not registered, please create group with new_group")
    return tag[5:] if tag.startswith("user:") else tag


def _find_pg_by_ranks_and_tag(tag: str, ranks: list[int]) -> Any:
    """The group this rank belongs to with exactly ``ranks`` and ``tag`` ("" matches any tag)."""
    if tag and not tag.startswith(("ptd:", "user:")):
        tag = f"user:{tag}"
    return _lookup_tagged(current_world(), tag, list(ranks), members_only=True)


def _find_or_create_pg_by_ranks_and_tag(tag: str, ranks: list[int], stride: int) -> Any:
    """``ranks`` holds consecutive groups of ``stride`` ranks: find (or create, with ``tag``)
    the one this rank is in. Only that group's members need to call it."""
    if stride <= 0 or len(ranks) % stride:
        raise ValueError(f"_find_or_create_pg_by_ranks_and_tag: {len(ranks)} ranks do not split by {stride}")
    me = get_rank()
    mine = next((ranks[i:i + stride] for i in range(0, len(ranks), stride) if me in ranks[i:i + stride]), None)
    if mine is None:
        raise ValueError(f"_find_or_create_pg_by_ranks_and_tag: rank {me} is not in {ranks}")
    mine = sorted(mine)
    pg = _find_pg_by_ranks_and_tag(tag, mine)
    if pg is not None:
        return pg
    if tag == "":
        raise ValueError("Cannot automatically create PG with empty tag")
    return _new_group_with_tag(mine, pg_tag=tag)


def new_subgroups(
    group_size: int | None = None,
    group: ProcessGroup | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[Any, list[Any]]:
    """Split the world into consecutive groups of ``group_size``; return (mine, all)."""
    world_size = get_world_size()
    group_size = group_size or world_size
    if group_size <= 0 or world_size % group_size:
        raise ValueError(f"new_subgroups: world size {world_size} is not divisible by group_size {group_size}")
    ranks_per = [list(range(s, s + group_size)) for s in range(0, world_size, group_size)]
    return new_subgroups_by_enumeration(ranks_per, timeout, backend, pg_options, group_desc)


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: list[list[int]],
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[Any, list[Any]]:
    me = get_rank()
    subgroups, mine = [], None
    for ranks in ranks_per_subgroup_list:
        g = new_group(ranks, timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc)
        subgroups.append(g)
        if me in ranks:
            mine = g
    return mine, subgroups


def _rank_not_in_group(group: Any) -> bool:
    if group is None:
        return False
    return isinstance(group, NonGroupMember)


def _resolve(group: Any) -> Any:
    return _get_default_group() if group is None else group


def member_group(group: Any) -> Any:
    """The group a call names (None: the default group), which this rank must be in: torch's
    ``ValueError`` otherwise (its reconfigure and window calls say so)."""
    pg = _resolve(group)
    if _rank_not_in_group(pg):
        raise ValueError("Invalid process group specified")
    return pg


def get_rank(group: Any = None) -> int:
    if _rank_not_in_group(group):
        return -1
    pg = _resolve(group)
    return pg.rank()


def get_world_size(group: Any = None) -> int:
    if _rank_not_in_group(group):
        return -1
    return _resolve(group).size()


def get_backend(group: Any = None) -> str:
    world = current_world()
    pg = _resolve(group)
    if _rank_not_in_group(pg):
        raise ValueError("Invalid process group specified")
    return world.pg_backend.get(pg, world.backend_name or "undefined")


def get_backend_impl(group: Any = None, device: Any = None) -> Any:
    """The engine under ``group`` (a group, its name, or None for the default group): what
    moves its bytes, for backend-specific calls. One engine serves every device."""
    if isinstance(group, str):
        named = [pg for pg, name in current_world().pg_names.items() if name == group]
        if not named:
            raise ValueError(f"get_backend_impl: no process group is named {group!r}")
        group = named[0]
    pg = _resolve(group)
    if _rank_not_in_group(pg):
        raise ValueError("Invalid process group specified")
    return pg.get_backend(torch.device("cpu") if device is None else device)


def set_timeout(timeout: timedelta, group: Any = None) -> None:
    """The timeout of ``group``'s operations issued from now on (default group: None), as
    ``init_process_group``'s ``timeout`` set it at the start."""
    pg = _resolve(group)
    if _rank_not_in_group(pg):
        raise ValueError("Invalid process group specified")
    pg.set_timeout(_as_timeout(timeout))


def get_process_group_ranks(group: Any) -> list[int]:
    pg = _resolve(group)
    mapping = current_world().pg_group_ranks.get(pg)
    if mapping is None:
        raise ValueError(f"Group {group} is not registered, please create group with torch.distributed.new_group API")
    return list(mapping.keys())


def get_group_rank(group: Any, global_rank: int) -> int:
    world = current_world()
    if group is None or group is world.default_pg:
        return global_rank
    mapping = world.pg_group_ranks.get(group)
    if mapping is None:
        raise ValueError(f"Group {group} is not registered, please create group with torch.distributed.new_group API")
    if global_rank not in mapping:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return mapping[global_rank]


def get_global_rank(group: Any, group_rank: int) -> int:
    world = current_world()
    if group is None or group is world.default_pg:
        return group_rank
    mapping = world.pg_group_ranks.get(group)
    if mapping is None:
        raise ValueError(f"Group {group} is not registered, please create group with torch.distributed.new_group API")
    for g, r in mapping.items():
        if r == group_rank:
            return g
    raise ValueError(f"Group rank {group_rank} is not part of group {group}")


def get_pg_count() -> int:
    return len(current_world().pg_names)


def destroy_process_group(group: Any = None) -> None:
    """Shut a group down (its progress thread, and its connections if it owns them).

    With no argument: every group, the default one last, and the world is reset.
    """
    _end_groups(group, "shutdown")


def abort_process_group(group: Any = None) -> None:
    """Abort a group after a failure: tell its members (best effort), fail every operation
    still pending on it, and shut it down without waiting for peers that may be dead.

    With no argument (or the default group): every group and the world, which is then reset
    so that ``init_process_group`` can be called again in the same process, e.g. by the
    survivors of a failed rank with a new store prefix and renumbered ranks (see
    ``examples/elastic_shrink.py``). torch spells it ``_abort_process_group``.
    """
    _end_groups(group, "abort")


def _end_groups(group: Any, how: str) -> None:
    """``shutdown`` or ``abort`` one group, or (None / the default group) every group, the
    default one last, and reset the world."""
    world = current_world()
    if group is None or group is world.default_pg:
        if world.default_pg is None:
            if how == "shutdown":
                warnings.warn("destroy_process_group: no process group is initialized", stacklevel=3)
            return
        for pg in list(world.pg_names):
            if pg is not world.default_pg and isinstance(pg, ProcessGroup):
                getattr(pg, how)()
        getattr(world.default_pg, how)()
        world.reset()
        return
    if isinstance(group, ProcessGroup):
        getattr(group, how)()
    world.unregister(group)


_abort_process_group = abort_process_group
