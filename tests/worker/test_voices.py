"""The voices a worker holds: least-recently-used eviction past the budget, waiting requests.

Policy only: the held "engines" are plain strings and sizes are given, so every eviction here is
exact. The loads themselves (real engines, real worker processes) are exercised end to end in
tests/lifecycle/test_catalog.py.
"""

from __future__ import annotations

import mmap

import numpy as np

from ttsvc.protocol import EngineSpec, SynthesisJob
from ttsvc.repository.layout import EngineVersion
from ttsvc.worker.voices import VoiceSet, footprint, resident_bytes, spec_bytes

MB = 2**20


def job(uid: str, voice: str) -> SynthesisJob:
    return SynthesisJob(uid, "text", 1.0, 0.0, 0.0, 0.2, voice=voice)


def test_least_recently_used_voice_is_evicted_past_the_budget() -> None:
    held: VoiceSet[str] = VoiceSet({}, budget_bytes=130 * MB)
    assert held.put("a", "A", 60 * MB) == []
    assert held.put("b", "B", 60 * MB) == []
    assert held.get("a") == "A"  # a is now the most recently used
    assert held.put("c", "C", 60 * MB) == ["b"]
    assert held.names() == ("a", "c")
    assert held.get("b") is None
    assert held.used() == 120 * MB


def test_the_voice_just_loaded_stays_even_over_a_small_budget() -> None:
    held: VoiceSet[str] = VoiceSet({}, budget_bytes=10 * MB)
    held.put("a", "A", 60 * MB)
    assert held.put("b", "B", 60 * MB) == ["a"]
    assert held.names() == ("b",)


def test_no_budget_holds_every_voice() -> None:
    held: VoiceSet[str] = VoiceSet({}, budget_bytes=0)
    for name in "abcd":
        assert held.put(name, name.upper(), 60 * MB) == []
    assert held.names() == ("a", "b", "c", "d")


def test_a_swap_replaces_the_voice_in_place_without_evicting_it() -> None:
    held: VoiceSet[str] = VoiceSet({}, budget_bytes=130 * MB)
    held.put("a", "A1", 60 * MB)
    held.put("b", "B", 60 * MB)
    assert held.put("a", "A2", 60 * MB) == []
    assert held.get("a") == "A2"
    assert held.names() == ("b", "a")


def test_requests_wait_for_one_load_per_voice_and_can_leave() -> None:
    held: VoiceSet[str] = VoiceSet({})
    assert held.wait(job("1", "a"), "a") is True  # the first starts the load
    assert held.wait(job("2", "a"), "a") is False
    assert held.wait(job("3", "b"), "b") is True
    assert held.waiting_count() == 3
    assert held.drop_waiting("2") is True
    assert held.drop_waiting("2") is False
    assert [j.uid for j in held.loaded("a")] == ["1"]
    assert held.drop_waiting("3") is True
    assert "b" not in held.waiting  # nobody needs b now: it is not loaded
    assert held.loaded("a") == []
    assert held.waiting_count() == 0


def test_spec_bytes_sums_the_manifest_files(default_version: EngineVersion) -> None:
    manifest = (default_version.path / "manifest.json").read_text(encoding="utf-8")
    spec = EngineSpec("1", "v", 1, "src", {}, (), manifest, "cache")
    on_disk = sum(p.stat().st_size for p in default_version.path.iterdir()
                  if p.name != "manifest.json")  # fmt: skip
    assert spec_bytes(spec) == on_disk


def test_voices_count_by_the_first_voice_s_footprint_per_file_byte(
    default_version: EngineVersion,
) -> None:
    manifest = (default_version.path / "manifest.json").read_text(encoding="utf-8")
    spec = EngineSpec("1", "v", 1, "src", {}, (), manifest, "cache")
    files = spec_bytes(spec)
    assert footprint(spec, 0) == 1.0  # never less than its files
    assert footprint(spec, -5 * MB) == 1.0  # memory freed meanwhile by something else
    ratio = footprint(spec, 2 * files)
    assert ratio == 2.0
    held: VoiceSet[str] = VoiceSet({}, budget_bytes=5 * files, per_file_byte=ratio)
    assert held.size(spec) == 2 * files
    held.put("a", "A", held.size(spec))
    held.put("b", "B", held.size(spec))
    assert held.put("c", "C", held.size(spec)) == ["a"]  # 6 x files over a 5 x budget


def test_resident_bytes_sees_memory_the_process_touches() -> None:
    """64 MB mapped fresh (not through the allocator, which may hand back memory a test before
    freed and kept resident: seen once, 0 bytes grown) and written with distinct bytes."""
    before = resident_bytes()
    with mmap.mmap(-1, 64 * MB) as block:
        block.write(np.random.default_rng(0).bytes(64 * MB))  # every page written
        grown = resident_bytes() - before
    assert before > 0
    assert grown >= 48 * MB, grown
