"""Batches as durable objects: a pending batch is never overwritten; `select` refuses while one is pending, names
it and the two ways on (`--alongside`, `--cancel`); batches out at once never share an image."""

from __future__ import annotations

import pytest

from units_lightning.annotation import IngestError, LabelStore, SimulatedAnnotator, ingest, read_manifest
from units_lightning.annotation.commands import select_main


def batches(root):
    return [read_manifest(p) for p in sorted((root / "batches").iterdir())]


def images_of(batch):
    return {p.image for s in batch.query_sets for p in s.images}


def test_select_refuses_while_a_batch_is_pending_and_never_overwrites_it(glyph_project, project_options):
    root, key = glyph_project
    options = [*project_options(root), "--budget", "2"]
    select_main(options)
    (first,) = batches(root)
    manifest = (root / "batches" / first.id / "manifest.json").read_bytes()
    with pytest.raises(ValueError) as refused:
        select_main(options)  # run again before ingest
    message = str(refused.value)
    assert f"1 batch(es) pending: {first.id} (2 of 2 query sets not ingested" in message
    assert "--alongside true" in message and f"--cancel {first.id}" in message
    assert (root / "batches" / first.id / "manifest.json").read_bytes() == manifest and len(batches(root)) == 1
    with pytest.raises(ValueError, match=f"the project has a batch {first.id} already"):
        select_main([*options, "--alongside", "true", "--batch_id", first.id])
    assert (root / "batches" / first.id / "manifest.json").read_bytes() == manifest
    ingest(first, SimulatedAnnotator(key).answer(first), "key")
    select_main(options)  # nothing pending: a new batch
    assert [b.id[:9] for b in batches(root)] == ["batch-001", "batch-002"]


def test_batches_out_at_once_share_no_image_and_each_is_ingested(glyph_project, project_options):
    root, key = glyph_project
    options = [*project_options(root), "--budget", "3"]
    select_main(options)
    select_main([*options, "--alongside", "true"])
    first, second = batches(root)
    assert first.id != second.id and not images_of(first) & images_of(second)
    store = LabelStore.load(root / "labels.json")
    assert [b.id for b in store.pending()] == [first.id, second.id]
    for batch in (second, first):
        ingest(batch, SimulatedAnnotator(key).answer(batch), "key")
    store = LabelStore.load(root / "labels.json")
    assert not store.pending() and dict(store.labels) == {i: key[i] for i in images_of(first) | images_of(second)}


def test_a_cancelled_batch_gives_its_images_back_and_cannot_be_ingested(glyph_project, project_options, capsys):
    root, key = glyph_project
    options = [*project_options(root), "--budget", "9"]  # every candidate: 3 tasks x 3 query sets
    select_main(options)
    (first,) = batches(root)
    with pytest.raises(ValueError, match="no batch batch-404 was sent out by select"):
        select_main([*options, "--cancel", "[batch-404]"])
    select_main([*options, "--cancel", f"[{first.id}]"])
    assert f"cancelled {first.id}" in capsys.readouterr().out
    second = next(b for b in batches(root) if b.id != first.id)
    assert len(second.query_sets) == 9  # the cancelled batch's images were free again
    with pytest.raises(IngestError, match=f"batch {first.id} was cancelled"):
        ingest(first, SimulatedAnnotator(key).answer(first), "key")
    assert not (LabelStore.load(root / "labels.json").labels)
