"""The object compaction benchmark's smoke run: a short produce without and with compaction.
It checks the report's figures are there and that compaction left fewer objects, each in the
store as in the image, so the benchmark cannot rot unnoticed; no timing is judged."""

from __future__ import annotations

from pathlib import Path

from bench.compaction_bench import run


async def test_a_short_produce_with_and_without_compaction(tmp_path: Path) -> None:
    without = await run(tmp_path / "off", uploads=12, streams=4, every=4, compact=False)
    with_compaction = await run(tmp_path / "on", uploads=12, streams=4, every=4, compact=True)
    assert without["stream_set_objects"] == 12
    assert with_compaction["stream_set_objects"] < without["stream_set_objects"]
    assert with_compaction["metadata_entries"] < without["metadata_entries"]
    for result in (without, with_compaction):
        assert result["objects_in_store"] == result["objects_in_image"]
        assert result["produced_mb"] > 0
