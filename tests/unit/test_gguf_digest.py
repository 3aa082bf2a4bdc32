"""The converted copy of a GGUF file is found by the file's content, not its path or mtime
(inference/llm/loader.py): a reinstalled package's identical file reuses it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from inference.llm.loader import GGUF_DIGESTS, gguf_cache_folder, gguf_digest, prune_stale_conversions


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_same_bytes_elsewhere_or_later_share_a_folder_other_bytes_do_not(tmp_path):
    cache = tmp_path / "cache"
    first = write(tmp_path / "site-a" / "model.gguf", b"GGUF" + bytes(range(256)) * 64)
    reinstalled = write(tmp_path / "site-b" / "model.gguf", first.read_bytes())
    os.utime(reinstalled, ns=(1, 1))  # another mtime, as a reinstall gives it
    edited = write(tmp_path / "site-c" / "model.gguf", b"GGUF" + bytes(range(255, -1, -1)) * 64)  # same size
    assert gguf_cache_folder(first, cache) == gguf_cache_folder(reinstalled, cache)
    assert gguf_cache_folder(edited, cache) != gguf_cache_folder(first, cache)
    assert gguf_cache_folder(first, cache).name.startswith("model-")


def test_a_file_is_read_once_per_version_and_gone_files_are_forgotten(tmp_path):
    cache = tmp_path / "cache"
    model = write(tmp_path / "model.gguf", b"GGUF one")
    other = write(tmp_path / "other.gguf", b"GGUF two")
    digest = gguf_digest(model, cache)
    gguf_digest(other, cache)
    # New bytes under the same size and mtime: the remembered digest answers without reading the file.
    stat = model.stat()
    model.write_bytes(b"GGUF 1ne")
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert gguf_digest(model, cache) == digest
    # A new mtime makes it read the file again; the old version's entry and the deleted file's go.
    os.utime(model, ns=(1, 1))
    other.unlink()
    assert gguf_digest(model, cache) != digest
    index = json.loads((cache / GGUF_DIGESTS).read_text())
    assert list(index) == [f"{model.resolve()}|{model.stat().st_size}|1"]


def test_a_path_with_a_bar_in_it_is_remembered_too(tmp_path):
    cache = tmp_path / "cache"
    model = write(tmp_path / "a|b" / "model.gguf", b"GGUF bar")
    digest = gguf_digest(model, cache)
    gguf_digest(write(tmp_path / "other.gguf", b"GGUF other"), cache)  # rewrites the index, keeping current files
    assert json.loads((cache / GGUF_DIGESTS).read_text())[f"{model.resolve()}|{model.stat().st_size}|"
                                                          f"{model.stat().st_mtime_ns}"] == digest


def test_a_broken_index_or_an_unwritable_cache_only_costs_a_rehash(tmp_path):
    model = write(tmp_path / "model.gguf", b"GGUF bytes")
    cache = tmp_path / "cache"
    digest = gguf_digest(model, cache)
    (cache / GGUF_DIGESTS).write_text("{not json")
    assert gguf_digest(model, cache) == digest
    assert json.loads((cache / GGUF_DIGESTS).read_text())  # rewritten whole
    (cache / GGUF_DIGESTS).write_text("[1, 2]")
    assert gguf_digest(model, cache) == digest
    blocked = write(tmp_path / "a-file", b"") / "cache"  # its parent is a file: nothing can be written
    assert gguf_digest(model, blocked) == digest
    assert not list(cache.glob(f".{GGUF_DIGESTS}.*"))  # no temporary index left behind


def test_conversions_of_other_versions_are_pruned_others_kept(tmp_path):
    cache = tmp_path / "cache"
    model = write(tmp_path / "model.gguf", b"GGUF v2")
    keep = gguf_cache_folder(model, cache)
    others = ["other-0123456789abcdef", "model-v2-0123456789abcdef", "model-notes"]  # not this stem's conversions
    for name in [keep.name, "model-0123456789abcdef", "model-fedcba9876543210", *others]:
        (cache / name).mkdir(parents=True, exist_ok=True)
    (cache / "model-notes.txt").write_text("a file, not a conversion")
    removed = prune_stale_conversions(model, cache)
    assert sorted(p.name for p in removed) == ["model-0123456789abcdef", "model-fedcba9876543210"]
    assert sorted(p.name for p in cache.iterdir()) == sorted([GGUF_DIGESTS, keep.name, "model-notes.txt", *others])
    # Without a digest index nothing is known to be stale: nothing goes.
    assert prune_stale_conversions(model, tmp_path / "empty") == []
