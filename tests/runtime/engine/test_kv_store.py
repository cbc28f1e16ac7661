"""The store Loom's vLLM KV connector moves KV through: block names that are their whole
prefix, whole blocks or none, a bound on what it keeps; and what the router reads of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loom.core.errors import ConfigError
from loom.perf.transfer import KvLinks
from loom.runtime.engine import EngineConfig
from loom.runtime.engine.kv_store import KvStore, block_hashes, namespace
from loom.runtime.engine.launcher import EngineDevice, kv_bytes_per_token


def test_a_blocks_name_is_its_whole_prefix() -> None:
    a = list(range(100))
    b = [*a[:40], 7, *a[41:]]
    na, nb = block_hashes(a, 16), block_hashes(b, 16)
    assert len(na) == 6  # full blocks only: 100 // 16
    assert na[:2] == nb[:2]  # equal up to the block that differs ...
    assert all(x != y for x, y in zip(na[2:], nb[2:], strict=True))  # ... and after it
    assert block_hashes(a[:50], 16) == na[:3]  # a prefix's names are the prefix of the names
    assert block_hashes(a, 16, salt="s") != na  # a cache salt keeps blocks apart
    assert len(set(na)) == len(na)
    with pytest.raises(ConfigError, match="block_size"):
        block_hashes(a, 0)
    assert namespace("m", "float32", 16, 1, 0) != namespace("m", "float32", 16, 1, 1)


def test_the_store_writes_whole_blocks_once_and_counts_what_leads(tmp_path: Path) -> None:
    s = KvStore(tmp_path / "store")
    names = block_hashes(list(range(64)), 16)
    assert s.write(names[0], b"x" * 10) and not s.write(names[0], b"y")  # first write stays
    assert s.read(names[0]) == b"x" * 10
    s.write(names[1], b"z")
    s.write(names[3], b"w")
    assert s.leading(names, 0) == 2  # a gap ends the run
    assert s.leading(names, 1) == 1 and s.leading(names, 2) == 0
    assert s.leading(names, 0, ranks=2) == 0  # rank 1 has none of them
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".part-")]


def test_the_store_drops_its_oldest_blocks_beyond_its_bound(tmp_path: Path) -> None:
    s = KvStore(tmp_path, max_bytes=250)
    names = block_hashes(list(range(80)), 16)
    for i, name in enumerate(names):
        s.write(name, b"k" * 100)
        os.utime(s.path(name), (1000 + i, 1000 + i))
    s.trim()
    assert [s.has(n) for n in names] == [False, False, False, True, True]
    with pytest.raises(ConfigError, match="max_bytes"):
        KvStore(tmp_path, max_bytes=0)


def test_the_launcher_starts_vllm_with_the_connector_and_what_the_router_weighs(
    tmp_path: Path,
) -> None:
    model = tmp_path / "m"
    model.mkdir()
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    (model / "config.json").write_text(json.dumps({**cfg, "hidden_size": 256}))
    assert kv_bytes_per_token(model, EngineDevice.CPU) == 2 * 2 * 2 * 64 * 4
    (model / "config.json").write_text(
        json.dumps({**cfg, "head_dim": 128, "torch_dtype": "bfloat16"})
    )
    assert kv_bytes_per_token(model, EngineDevice.GPU) == 2 * 2 * 2 * 128 * 2
    (model / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="KV shape"):
        kv_bytes_per_token(model, EngineDevice.CPU)
    (model / "config.json").write_text(json.dumps({**cfg, "hidden_size": 256}))
    engine = EngineConfig(kv_store=tmp_path / "kv", device=EngineDevice.CPU)
    cmd = engine.command(model, 8000)
    transfer = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector"] == "LoomKVConnector"
    assert transfer["kv_load_failure_policy"] == "recompute"  # a bad block is recomputed
    extra = transfer["kv_connector_extra_config"]
    assert extra["path"] == str((tmp_path / "kv").absolute()) and extra["kv_bytes_per_token"]
    assert "--kv-transfer-config" not in EngineConfig(device=EngineDevice.CPU).command(model, 1)
    with pytest.raises(ConfigError, match="kv_store_bytes"):
        EngineConfig(kv_store=tmp_path, kv_store_bytes=0)


def test_kv_moves_only_between_engines_that_reach_each_other() -> None:
    direct = KvLinks(node=0, kv_bytes_per_token=10, nvlink_gbs=1.0)
    store = KvLinks(node=0, kv_bytes_per_token=10, nvlink_gbs=1.0, store="/dev/shm/a")
    other = KvLinks(node=0, kv_bytes_per_token=10, nvlink_gbs=1.0, store="/dev/shm/b")
    assert direct.reaches(direct) and store.reaches(store)
    assert not direct.reaches(store) and not store.reaches(other)
