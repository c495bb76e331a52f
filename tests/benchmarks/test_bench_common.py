"""The shared benchmark helpers' contracts that every result file depends on: one percentile
function with both interpolations its callers publish, the markdown table writer, strict JSON
with the raw records kept out of the committed results, and the streamed-WAV reader."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bench_common import (
    chosen_sections,
    markdown_table,
    pct,
    raw_path,
    read_wav,
    run_sections,
    write_json,
    write_raw,
)


def test_nearest_rank_never_interpolates() -> None:
    values = [float(v) for v in range(1, 101)]
    assert pct(values, 50, "nearest_rank") == 50.0
    assert pct(values, 99, "nearest_rank") == 99.0
    assert pct([3.0, 1.0, 2.0], 0, "nearest_rank") == 1.0  # rank at least 1, sorted first
    assert pct([], 99, "nearest_rank") is None
    for n in (1, 7, 99, 101):
        data = [float((i * 37) % n) for i in range(n)]
        for q in (50.0, 90.0, 99.0, 99.9):
            want = sorted(data)[max(1, math.ceil(q / 100.0 * n)) - 1]
            assert pct(data, q, "nearest_rank") == want


def test_markdown_table_aligns_and_checks_columns() -> None:
    text = markdown_table(["a", "n"], "lr", [["x", "1"], ["y", "22"]])
    assert text == "| a | n |\n|---|---:|\n| x | 1 |\n| y | 22 |"
    with pytest.raises(ValueError):
        markdown_table(["a", "n"], "l", [])


def test_json_is_strict_and_raw_records_go_beside_it(tmp_path: Path) -> None:
    result = tmp_path / "results" / "x.json"
    write_json(result, {"v": float("nan")})
    assert result.read_text(encoding="utf-8") == '{\n "v": null\n}\n'
    raw = write_raw(result, [{"ttfa_ms": 1.0}])
    assert raw == raw_path(result) == tmp_path / "results" / "raw" / "x.json"
    assert json.loads(raw.read_text(encoding="utf-8")) == [{"ttfa_ms": 1.0}]
    assert not list(tmp_path.rglob("*.tmp"))


def test_read_wav_times_the_first_byte_after_the_header() -> None:
    header = bytearray(44)
    header[24:28] = (16000).to_bytes(4, "little")
    chunks = [bytes(header[:30]), bytes(header[30:]), b"\0" * 3200, b"\0" * 1600]

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def go() -> tuple[int, int, float | None, list[tuple[float, float]]]:
        transport = httpx.MockTransport(lambda _: httpx.Response(200, content=body()))
        async with httpx.AsyncClient(transport=transport) as client:
            async with client.stream("POST", "http://bench/synthesize") as resp:
                got = await read_wav(resp, 0.0)
        return got.rate, got.audio_bytes, got.ttfa_ms, got.reads

    rate, audio_bytes, ttfa_ms, reads = asyncio.run(go())
    assert (rate, audio_bytes) == (16000, 4800)
    assert ttfa_ms is not None
    assert [seconds for _, seconds in reads] == [0.1, 0.05]


def test_a_sectioned_benchmark_merges_the_sections_it_ran_into_its_json(tmp_path: Path) -> None:
    assert chosen_sections("b, a", ("a", "b", "c")) == ["b", "a"]
    with pytest.raises(SystemExit, match="unknown sections"):
        chosen_sections("a,z", ("a", "b"))
    path = tmp_path / "bench.json"
    runners = {"a": lambda: {"x": 1}, "b": lambda: {"y": 2}}
    run_sections(path, "bench", {"cpu": "here"}, runners, ["a", "b"], {"flag": 3})
    run_sections(path, "bench", {"cpu": "here"}, {**runners, "b": lambda: {"y": 5}}, ["b"])
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "bench" and doc["machine"] == {"cpu": "here"}
    assert doc["sections"]["a"]["x"] == 1 and doc["sections"]["a"]["settings"] == {"flag": 3}
    assert doc["sections"]["b"]["y"] == 5 and "settings" not in doc["sections"]["b"]
    assert doc["sections"]["a"]["date"]
