"""The built-in kernels' hook convention: ``module_hooks`` reads a module's hooks by name."""

from __future__ import annotations

import importlib

import pytest

from kernels.registry import KERNELS
from kernels.spec import HOOK_NAMES, KernelOptionError, module_hooks


def _hook(*_args):
    return None


def _namespace(*names: str) -> dict[str, object]:
    return {"__name__": "kernels.fake", **{name: _hook for name in names}}


def test_module_hooks_fills_every_field_from_the_function_of_its_conventional_name():
    hooks = module_hooks(_namespace(*HOOK_NAMES.values()))
    assert hooks == dict.fromkeys(HOOK_NAMES, _hook)


def test_a_hook_the_module_does_not_define_is_none():
    hooks = module_hooks(_namespace("make_inputs", "input_shapes", "jax_function"))
    assert hooks["jax_fn"] is _hook
    assert [f for f, fn in hooks.items() if fn is None] == [
        "count_fn", "reference_fn", "tf_fn", "torch_fn"
    ]


@pytest.mark.parametrize("lacking", ["make_inputs", "input_shapes"])
def test_a_module_without_a_required_hook_is_refused_naming_it(lacking):
    names = [n for n in HOOK_NAMES.values() if n != lacking]
    with pytest.raises(KernelOptionError, match=f"kernels.fake defines no {lacking}"):
        module_hooks(_namespace(*names))


def test_a_conventional_name_that_is_not_a_function_is_refused():
    namespace = _namespace(*HOOK_NAMES.values()) | {"reference": 3.0}
    with pytest.raises(KernelOptionError, match="reference must be a function"):
        module_hooks(namespace)


@pytest.mark.parametrize("name", KERNELS)
def test_each_built_in_kernel_spec_holds_its_modules_conventionally_named_functions(name):
    module = importlib.import_module(f"kernels.{name}")
    for field, function in HOOK_NAMES.items():
        assert getattr(module.SPEC, field) is getattr(module, function), (name, field)
