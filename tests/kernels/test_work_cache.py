"""The compiled work kept on disk: read back by a process that never analysed it, under a key that
changes with the workload's source, and never a fallback."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest

from kernels import compiled_work, cost, get_spec, work_cache

STENCIL = get_spec("stencil")


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """An empty disk cache, and a process that has analysed nothing yet."""
    monkeypatch.setenv(work_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(cost, "_cache", {})
    return tmp_path / "cache" / "work"


def forget_and_forbid_analysis(monkeypatch):
    """As a new process that must not analyse: nothing in memory, and analysing fails loudly."""
    monkeypatch.setattr(cost, "_cache", {})

    def refuse(*args, **kwargs):
        raise AssertionError("analysed again")

    monkeypatch.setattr(cost, "_analyse", refuse)


def test_work_analysed_once_is_read_back_from_disk_without_analysing(disk, monkeypatch):
    first = compiled_work(STENCIL, "jax", "gpu", variant="2d")
    assert first.source == "xla_cost_analysis"
    assert len(list(disk.glob("*.json"))) == 1
    forget_and_forbid_analysis(monkeypatch)
    assert compiled_work(STENCIL, "jax", "gpu", variant="2d") == first
    with pytest.raises(AssertionError, match="analysed again"):  # other options: not kept yet
        compiled_work(STENCIL, "jax", "gpu", variant="1d")


def test_a_fallback_is_never_kept_and_an_empty_cache_dir_keeps_nothing(disk, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(cost, "_jax_work", fail)
    work = compiled_work(get_spec("gemm"), "jax", "gpu")
    assert work.source == "analytic" and "no compiler today" in work.note
    assert not list(disk.glob("*.json"))

    monkeypatch.undo()
    monkeypatch.setattr(cost, "_cache", {})
    monkeypatch.setenv(work_cache.CACHE_DIR_ENV, "")  # off
    assert compiled_work(STENCIL, "jax", "gpu").source == "xla_cost_analysis"
    assert work_cache.cache_dir() is None and not disk.exists()


def test_kept_analyses_once_and_keeps_no_fallback(disk):
    """The disk is consulted in one place: a result is analysed once, then read back; a fallback
    (``analytic``) is handed back but never kept, so the next process analyses again."""
    options = ("gpu", "2d", "float32", "default", True, False)
    calls = []

    def analyse(source="xla_cost_analysis"):
        calls.append(source)
        return cost.CompiledWork(2.0, 3.0, 1, source)

    first = work_cache.kept(STENCIL, "jax", options, cost.CompiledWork, analyse)
    assert work_cache.kept(STENCIL, "jax", options, cost.CompiledWork, analyse) == first
    assert calls == ["xla_cost_analysis"]
    other = ("gpu", "1d", "float32", "default", True, False)
    for _ in range(2):
        work_cache.kept(STENCIL, "jax", other, cost.CompiledWork, lambda: analyse("analytic"))
    assert calls == ["xla_cost_analysis", "analytic", "analytic"]
    assert len(list(disk.glob("*.json"))) == 1


def test_an_unreadable_file_is_analysed_again_and_written_anew(disk, monkeypatch):
    first = compiled_work(STENCIL, "jax", "gpu")
    (kept,) = disk.glob("*.json")
    kept.write_text('{"flops": 1')  # torn
    assert work_cache.load(kept.stem, cost.CompiledWork) is None
    monkeypatch.setattr(cost, "_cache", {})
    again = compiled_work(STENCIL, "jax", "gpu")
    assert (again.source, again.flops, again.bytes_moved) == (first.source, first.flops,
                                                              first.bytes_moved)
    assert work_cache.load(kept.stem, cost.CompiledWork) == again


def test_the_key_changes_with_the_source_of_the_workloads_functions(tmp_path, monkeypatch):
    module_file = tmp_path / "my_stencil.py"

    def spec_from(source: str):
        module_file.write_text(source)
        loader = importlib.util.spec_from_file_location("my_stencil", module_file)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        monkeypatch.setitem(sys.modules, "my_stencil", module)
        work_cache._sources_hash.cache_clear()  # noqa: SLF001 - a new process would read it anew
        return dataclasses.replace(STENCIL, jax_fn=module.jax_fn)

    options = ("gpu", "2d", "float32", "default", True, False)
    before = work_cache.key_of(spec_from("def jax_fn(size):\n    return lambda x: x * 2\n"),
                               "jax", options)
    after = work_cache.key_of(spec_from("def jax_fn(size):\n    return lambda x: x * 3\n"),
                              "jax", options)
    assert before != after
    assert work_cache.key_of(STENCIL, "jax", options) == work_cache.key_of(STENCIL, "jax", options)
    assert work_cache.key_of(STENCIL, "jax", options) != work_cache.key_of(
        STENCIL, "tensorflow", options)


def test_a_footprint_read_back_from_disk_is_still_xlas_memory_analysis(disk, monkeypatch):
    """The memory analysis comes from the same compile as the work: a worker that reads the work
    from disk sizes its trial from XLA's figures too, not from the estimate."""
    first = cost.kernel_memory(STENCIL, STENCIL.at("gpu"), "jax")
    assert first.source == "xla_memory_analysis" and first.output > 0
    forget_and_forbid_analysis(monkeypatch)
    assert cost.kernel_memory(STENCIL, STENCIL.at("gpu"), "jax") == first
