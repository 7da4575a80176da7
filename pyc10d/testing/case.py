"""``TestCase``: :class:`unittest.TestCase` with tensor-aware assertions.

PyTorch's own ``TestCase`` (in ``torch.testing._internal.common_utils``) needs
``expecttest`` and drags in a large test framework, so this is a small
replacement offering the parts the ported distributed tests rely on:

* ``assertEqual`` / ``assertNotEqual`` that compare tensors (dense or sparse),
  numbers and arbitrarily nested sequences/mappings of them, using
  :func:`torch.testing.assert_close` for tensors;
* ``assertWarnsOnceRegex`` for warnings that must be raised;
* a deterministic RNG seed in ``setUp``.
"""

from __future__ import annotations

import functools
import random
import re
import unittest
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

SEED = 1234

Msg = str | Callable[[str], str] | None


def set_rng_seed(seed: int = SEED) -> None:
    """Seed torch, ``random`` and (if present) numpy, as torch's test suite does."""
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return
    np.random.seed(seed)


def _is_number(x: Any) -> bool:
    if isinstance(x, (bool, int, float, complex)):
        return True
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, np.number | np.bool_)


def _as_tensor_if_array(x: Any) -> Any:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return x
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _is_sequence(x: Any) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes, bytearray))


def _identical(actual: Any, expected: Any) -> bool:
    """Whether two plain dense CPU tensors (or two ints) are equal element for element, with the
    same dtype and shape: such a pair passes ``assert_close`` under any tolerance, so it need
    not be asked. ``assert_close`` measured 289 us a call, this 2.6 us; the seeds' stress tests
    make 4,000 calls per rank (``tests/seeds``: 156 -> 134 CPU-s). Anything else (NaN, other
    dtypes, sparse, subclasses, floats, other devices: ``torch.equal`` has no meta kernel) goes
    the full way."""
    if type(actual) is torch.Tensor and type(expected) is torch.Tensor:
        return (
            actual.layout == torch.strided == expected.layout
            and actual.dtype == expected.dtype
            and actual.shape == expected.shape
            and actual.device.type == "cpu" == expected.device.type
            and not actual.is_quantized
            and bool(torch.equal(actual, expected))
        )
    return type(actual) is int and type(expected) is int and actual == expected


def _compare(actual: Any, expected: Any, path: str, opts: dict[str, Any]) -> None:
    """Raise ``AssertionError`` describing the first difference found."""
    if _identical(actual, expected):
        return
    actual, expected = _as_tensor_if_array(actual), _as_tensor_if_array(expected)
    where = f" at {path}" if path else ""
    a_tensor, e_tensor = isinstance(actual, torch.Tensor), isinstance(expected, torch.Tensor)
    if a_tensor and e_tensor:
        try:
            torch.testing.assert_close(
                actual,
                expected,
                rtol=opts["rtol"],
                atol=opts["atol"],
                equal_nan=True,
                check_device=opts["exact_device"],
                check_dtype=opts["exact_dtype"],
                check_layout=False,
                check_stride=False,
            )
        except AssertionError as exc:
            raise AssertionError(f"Tensors differ{where}:\n{exc}") from None
        return
    if a_tensor or e_tensor:
        tensor, other = (actual, expected) if a_tensor else (expected, actual)
        if not _is_number(other) or tensor.numel() != 1:
            raise AssertionError(
                f"Cannot compare {type(actual).__name__} with {type(expected).__name__}{where}"
            )
        _compare(tensor.item(), other, path, opts)
        return
    if _is_number(actual) and _is_number(expected):
        try:
            torch.testing.assert_close(
                actual,
                expected,
                rtol=opts["rtol"],
                atol=opts["atol"],
                equal_nan=True,
                check_dtype=False,
            )
        except AssertionError as exc:
            raise AssertionError(
                f"Numbers differ{where}: {actual!r} != {expected!r}\n{exc}"
            ) from None
        return
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        if set(actual) != set(expected):
            raise AssertionError(
                f"Keys differ{where}: {sorted(map(repr, actual))} != {sorted(map(repr, expected))}"
            )
        for key in actual:
            _compare(actual[key], expected[key], f"{path}[{key!r}]", opts)
        return
    if _is_sequence(actual) and _is_sequence(expected):
        if len(actual) != len(expected):
            raise AssertionError(f"Lengths differ{where}: {len(actual)} != {len(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, f"{path}[{i}]", opts)
        return
    if not actual == expected:
        raise AssertionError(f"{actual!r} != {expected!r}{where}")


def _format(msg: Msg, generated: str) -> str:
    if msg is None:
        return generated
    if callable(msg):
        return msg(generated)
    return f"{msg}\n{generated}"


class TestCase(unittest.TestCase):
    """Base class for pyc10d tests; see the module docstring."""

    def setUp(self) -> None:
        super().setUp()
        set_rng_seed()

    def assertEqual(  # noqa: N802 - unittest naming
        self,
        first: Any,
        second: Any,
        msg: Msg = None,
        *,
        atol: float | None = None,
        rtol: float | None = None,
        exact_dtype: bool = True,
        exact_device: bool = False,
    ) -> None:
        """Assert equality; tensors compare with :func:`torch.testing.assert_close`.

        ``msg`` may be a string (prepended to the generated message) or a callable
        receiving the generated message. ``atol``/``rtol`` must be given together.
        """
        if (atol is None) != (rtol is None):
            raise ValueError("atol and rtol must be specified together")
        opts = {
            "atol": atol,
            "rtol": rtol,
            "exact_dtype": exact_dtype,
            "exact_device": exact_device,
        }
        try:
            _compare(first, second, "", opts)
        except AssertionError as exc:
            raise self.failureException(_format(msg, str(exc))) from None

    def assertNotEqual(  # noqa: N802 - unittest naming
        self, first: Any, second: Any, msg: Msg = None, **kwargs: Any
    ) -> None:
        """Inverse of :meth:`assertEqual` (same comparison rules)."""
        try:
            self.assertEqual(first, second, **kwargs)
        except self.failureException:
            return
        raise self.failureException(_format(msg, f"{first!r} == {second!r}"))

    @contextmanager
    def assertWarnsOnceRegex(  # noqa: N802 - torch naming
        self, category: type[Warning], regex: str = ""
    ) -> Iterator[None]:
        """Fail unless the block warns with ``category`` and a message matching ``regex``.

        The match is anchored at the start (``re.match``), as in torch's helper;
        every warning is let through even if it was already shown once.
        """
        pattern = re.compile(regex)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        if not caught:
            self.fail("no warning caught")
        of_category = [w for w in caught if type(w.message) is category]
        self.assertTrue(of_category, f"no {category.__name__} among {[w.message for w in caught]}")
        self.assertTrue(
            any(pattern.match(str(w.message)) for w in caught),
            f"{pattern.pattern!r} not matched by {[str(w.message) for w in of_category]}",
        )


def dispatch_to_ranks(case: unittest.TestCase, method_name: str, is_main: Callable[[], bool],
                      join: Callable[[], Any]) -> None:
    """Wrap ``case.<method_name>``: the runner's call starts and joins the ranks (``join``);
    each rank's call runs the test body. Shared by the process and thread test cases."""
    method = getattr(case, method_name, None)
    if method_name == "runTest" or method is None:
        return

    @functools.wraps(method)
    def wrapper() -> Any:
        return join() if is_main() else method()

    setattr(case, method_name, wrapper)


def run_tests(argv: list[str] | None = None) -> None:
    """Run the tests of ``__main__`` (what ``python test_file.py`` should do)."""
    unittest.main(module="__main__", argv=argv)
