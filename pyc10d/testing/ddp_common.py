"""The DDP half of torch's ``test_c10d_common`` helpers, written anew for pyc10d.

Ported DDP tests import from here what torch's take from ``test_c10d_common`` and
``common_distributed``: the models (``Net``, ``DoubleGpuNet``, ``Task``,
``ModuleForDdpCommHook``, ``SparseGradientModule``), ``gpus_for_rank``,
``verify_ddp_error_logged`` and ``CommonDistributedDataParallelTest``, the shared test
bodies mixed into a backend's ``DistributedDataParallelTest``.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's spelling
from torch import nn

import pyc10d
from pyc10d.nn import DistributedDataParallel, GradBucket
from pyc10d.testing.c10d_common import ModuleForDdpCommHook, SparseGradientModule, Task
from pyc10d.testing.data import gpus_for_rank
from pyc10d.testing.net import LOOPBACK

__all__ = [
    "LOOPBACK",
    "CommonDistributedDataParallelTest",
    "DoubleGpuNet",
    "ModuleForDdpCommHook",
    "Net",
    "SparseGradientModule",
    "Task",
    "gpus_for_rank",
    "verify_ddp_error_logged",
]




class Net(nn.Module):
    """Three bias-free linear layers (2 -> 10 -> 50 -> 4) and a softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 10, bias=False)
        self.fc2 = nn.Linear(10, 50, bias=False)
        self.fc3 = nn.Linear(50, 4, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        x = self.fc3(x)
        return F.softmax(x, dim=1)


class DoubleGpuNet(nn.Module):
    """``Net`` split across two GPUs (tests using it skip without them)."""

    def __init__(self, gpus: list[int]) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 10, bias=False).to(gpus[0])
        self.fc2 = nn.Linear(10, 50, bias=False).to(gpus[1])
        self.fc3 = nn.Linear(50, 4, bias=False).to(gpus[1])
        self.relu = nn.ReLU()
        self.no_grad_param = nn.Parameter(torch.tensor([2, 2]).long(), requires_grad=False).to(gpus[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dev0, dev1 = self.fc1.weight.device, self.fc2.weight.device
        x = self.relu(self.fc1(x.to(dev0)))
        x = self.relu(self.fc2(x.to(dev1)))
        x = self.fc3(x)
        return F.softmax(x, dim=1).to(dev0)


def verify_ddp_error_logged(model_ddp: Any, err_substr: str) -> None:
    """Check that DDP recorded ``err_substr`` as its error in the logging data."""
    data = model_ddp._get_ddp_logging_data()
    assert "iteration" in data and "has_error" in data and "error" in data
    logged = data["error"]
    expected = err_substr.split("\nException raised from ")[0]
    assert expected in logged, f"Did not find expected {expected} in ddp logging data error: {logged}"


class CommonDistributedDataParallelTest:
    """Test bodies shared by every backend's ``DistributedDataParallelTest`` (a mixin)."""

    file_name: str
    rank: int

    def tearDown(self) -> None:  # unittest API
        super().tearDown()  # type: ignore[misc]
        try:
            os.remove(self.file_name)
        except OSError:
            pass

    @property
    def world_size(self) -> int:
        return 2

    def _get_store(self) -> Any:
        return pyc10d.FileStore(self.file_name, self.world_size)

    def _prepare_single_device_module(
        self, process_group: Any, devices: list[torch.device], device_ids: Any,
        global_batch_size: int, gradient_as_bucket_view: bool = False,
    ) -> tuple[nn.Module, DistributedDataParallel, torch.Tensor, torch.Tensor]:
        model = Net()
        device = devices[0] if devices else torch.device(f"cuda:{self.rank}")
        ddp_model = DistributedDataParallel(
            copy.deepcopy(model).to(device),
            device_ids=device_ids,
            process_group=process_group,
            bucket_cap_mb=0.001,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
        model.to(device)
        inp = torch.randn(global_batch_size, 2).to(device)
        target = torch.randn(global_batch_size, 4).to(device)
        return model, ddp_model, inp, target

    def _prepare_multi_device_module(
        self, process_group: Any, devices: list[torch.device], device_ids: Any,
        global_batch_size: int, gradient_as_bucket_view: bool = False,
    ) -> tuple[nn.Module, DistributedDataParallel, torch.Tensor, torch.Tensor]:
        if len(devices) not in (2, 4):
            raise ValueError("DoubleGpuNet needs 2 or 4 devices")
        model = DoubleGpuNet([d.index for d in devices])
        ddp_model = DistributedDataParallel(
            copy.deepcopy(model), device_ids=device_ids, process_group=process_group,
            bucket_cap_mb=0.001, gradient_as_bucket_view=gradient_as_bucket_view,
        )
        inp = torch.randn(global_batch_size, 2).cuda(devices[0])
        target = torch.randn(global_batch_size, 4)
        return model, ddp_model, inp, target

    def _test_ddp_with_process_group(
        self, process_group: Any, devices: list[torch.device], device_ids: Any,
        multi_device: bool = False, gradient_as_bucket_view: bool = False,
    ) -> None:
        """Two iterations of DDP on a slice of the batch match one process on all of it."""
        local_batch_size = 1 if devices is None else len(devices)
        global_batch_size = self.world_size * local_batch_size
        prepare = self._prepare_multi_device_module if multi_device else self._prepare_single_device_module
        model, ddp_model, inp, target = prepare(
            process_group, devices, device_ids, global_batch_size, gradient_as_bucket_view
        )
        logging_data = ddp_model._get_ddp_logging_data()
        self.assertEqual(bool(logging_data.get("is_multi_device_module")), multi_device)  # type: ignore[attr-defined]

        def step_model(model: nn.Module, inp: torch.Tensor, target: torch.Tensor) -> None:
            model.train()
            output = model(inp)
            loss = F.mse_loss(output, target.to(output.device))
            loss.backward()

        def update_parameters(model: nn.Module) -> None:
            for param in model.parameters():
                with torch.no_grad():
                    param -= param.grad
                param.grad = None

        for iteration in range(2):
            step_model(model, inp, target)
            lo, hi = self.rank * local_batch_size, (self.rank + 1) * local_batch_size
            step_model(ddp_model, inp[lo:hi], target[lo:hi])
            update_parameters(model)
            update_parameters(ddp_model)
            self.assertEqual(len(list(model.parameters())), len(list(ddp_model.parameters())))  # type: ignore[attr-defined]
            for i, j in zip(model.parameters(), ddp_model.parameters()):
                self.assertEqual(i, j, rtol=1.3e-06, atol=5e-5)  # type: ignore[attr-defined]
            torch.manual_seed(1337 + iteration)
            inp = inp[torch.randperm(global_batch_size)]

    def _run_and_verify_hook(self, model: Any, inp: Any, expected_grad: torch.Tensor) -> None:
        output = model(inp, self.rank)
        output.mean().backward()
        for p in model.parameters():
            self.assertEqual(p.grad, expected_grad)  # type: ignore[attr-defined]

    def _simple_hook(self, state: object, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(torch.ones_like(bucket.buffer()))

        def fut_then(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            t = fut.value()
            return t + torch.ones_like(t)

        return fut.then(fut_then)
