"""Each plugin's keys are declared once: its Hydra dataclass. What reads them must agree with it.

``RayGpusLauncherConf`` (what a user may type under ``hydra.launcher``) and ``LaunchSettings``
(what the launcher reads, checked) hold the same keys, types and defaults, and docs/cluster.md's
table lists those keys with those defaults; ``StabilitySweeperConf`` and ``SearchOptions`` likewise,
less the keys the sweeper keeps for itself.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from hydra_plugins.dvfs.ray_gpus_launcher import RayGpusLauncherConf
from hydra_plugins.dvfs.stability_sweeper import StabilitySweeper, StabilitySweeperConf
from orchestrator.launching.settings import LaunchSettings
from orchestrator.search.space import SearchOptions

ROOT = Path(__file__).resolve().parents[2]


def keys(schema: Any) -> dict[str, dataclasses.Field]:
    """A dataclass's fields by name, less Hydra's ``_target_``."""
    return {f.name: f for f in dataclasses.fields(schema) if f.name != "_target_"}


def default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def plain(t: Any) -> Any:
    """A type in one spelling: ``Optional[str]`` is ``str | None``, ``Dict`` is ``dict``."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is None:
        return t
    if origin in (Union, types.UnionType):
        return frozenset(plain(a) for a in args)
    return (origin, tuple(plain(a) for a in args))


def same_type(conf_type: Any, typed: Any) -> bool:
    """Equal types; a Hydra ``Any`` stands only for a union, which OmegaConf cannot declare."""
    if conf_type is Any:
        return isinstance(plain(typed), frozenset)
    return plain(conf_type) == plain(typed)


def test_the_launchers_settings_hold_the_hydra_schemas_keys_types_and_defaults():
    conf, typed = keys(RayGpusLauncherConf), keys(LaunchSettings)
    assert list(conf) == list(typed)
    conf_types = typing.get_type_hints(RayGpusLauncherConf)
    typed_types = typing.get_type_hints(LaunchSettings)
    for name in conf:
        assert same_type(conf_types[name], typed_types[name]), name
        assert default(conf[name]) == default(typed[name]), name
    # and the launcher, handed the schema's defaults, reads the settings' defaults
    given = {name: default(f) for name, f in keys(RayGpusLauncherConf).items()}
    assert LaunchSettings.from_mapping(given) == LaunchSettings()


def test_the_sweepers_options_hold_the_hydra_schemas_keys_types_and_defaults():
    given = {name: default(f) for name, f in keys(StabilitySweeperConf).items()}
    handed = StabilitySweeper(**given).options  # what the sweeper passes on to SearchOptions
    typed = keys(SearchOptions)
    assert sorted(handed) == sorted(typed)
    assert SearchOptions(**handed) == SearchOptions()
    conf_types = typing.get_type_hints(StabilitySweeperConf)
    typed_types = typing.get_type_hints(SearchOptions)
    for name in typed:
        assert same_type(conf_types[name], typed_types[name]), name


def cluster_table() -> dict[str, Any]:
    """docs/cluster.md's table of ``hydra.launcher`` keys: key -> its default, parsed."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", text, flags=re.MULTILINE)
    return {k: yaml.safe_load(v) for k, v in rows}


def test_the_cluster_page_lists_every_launcher_key_with_its_default():
    table = cluster_table()
    conf = keys(RayGpusLauncherConf)
    assert list(table) == list(conf)
    for name, f in conf.items():
        assert table[name] == default(f), name
