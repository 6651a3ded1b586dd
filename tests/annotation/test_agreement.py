"""Partial and disputed answers: complete query sets are taken in and the rest stay pending; "can't tell" removes
its query set from the batch (counted, the image never offered again, no answer lost); several annotators per
image under an agreement rule, the disputes listed for review."""

from __future__ import annotations

import csv

import pytest
import torch
from tiny_setup import tiny_model

from units_lightning.annotation import AnnotatedTasksDataModule, LabelStore, SimulatedAnnotator, select_batch
from units_lightning.annotation.agreement import agreed_label, verdict
from units_lightning.annotation.answers import CANT_TELL, Answer, read_label_studio_export
from units_lightning.annotation.batch import write_batch
from units_lightning.annotation.commands import ingest_main
from units_lightning.annotation.ingest import ingest_outcome
from units_lightning.samplers import MultiQuerySampler


@pytest.fixture
def batch(project, make_batch):
    return make_batch(project, [(t.name, list(t.unlabeled[:5])) for t in project.tasks[:2]], "batch-001")


def wrong(batch, image, key):
    return next(c for c in batch.images[image][1].classes if c != key[image])


def test_the_agreement_rules():
    assert agreed_label(["a", "a", "b"]) == "a" and agreed_label(["a", "b"]) is None
    assert agreed_label(["a", "a", "b"], "unanimous") is None and agreed_label(["a", "a"], "unanimous") == "a"
    assert agreed_label([CANT_TELL, CANT_TELL, "a"]) == CANT_TELL
    waiting = verdict("x", [Answer("x", "a", "1")], annotators=2)
    assert waiting.waiting and not waiting.disputed and waiting.label is None
    with pytest.raises(ValueError, match="unknown agreement rule 'most'"):
        agreed_label(["a"], "most")


def test_cant_tell_removes_the_query_set_counts_it_and_keeps_the_other_answers(batch, glyph_project, project):
    root, key = glyph_project
    answers = SimulatedAnnotator(key).answer(batch)
    unsure = batch.query_sets[1].images[2].image
    answers = [Answer(a.image, CANT_TELL, a.where) if a.image == unsure else a for a in answers]
    outcome = ingest_outcome(batch, answers, "answers.csv")
    assert outcome.labeled == batch.query_sets[:1] and not outcome.pending
    (removed,) = outcome.removed
    assert removed.cant_tell == (unsure,) and removed.task == batch.query_sets[1].task
    assert dict(removed.answers) == {p.image: key[p.image] for p in batch.query_sets[1].images if p.image != unsure}
    store = LabelStore.load(root / "labels.json")
    assert store.cant_tell == {unsure: "batch-001"} and store.ledger["query_sets"] == 1  # counted apart
    assert store.removed[0] == removed  # written: no answer lost
    data = AnnotatedTasksDataModule(
        root=str(root), image_size=16, n_way=5, k_shot=1, sampler=MultiQuerySampler(tasks=2, query_sets=6)
    )
    torch.manual_seed(0)
    offered = select_batch(tiny_model(sampler=data.sampler), data, 100, step=5, lam=0.5)
    images = {p.image for s in offered.query_sets for p in s.images}
    assert unsure not in images  # never offered again
    assert set(removed.answers) <= images  # the removed set's other images go back to the pool


def test_a_skipped_label_studio_annotation_is_a_cant_tell_answer():
    export = [{"id": 3, "data": {"image_id": "a.png"}, "annotations": [{"id": 7, "was_cancelled": True, "result": []}]}]
    skipped = Answer("a.png", CANT_TELL, "export.json task 3 annotation 7 (skipped)")
    assert read_label_studio_export(export, "export.json") == [skipped]


def test_several_annotators_the_majority_or_unanimous_rule_and_the_disputes_to_review(
    batch, glyph_project, tmp_path, capsys
):
    root, key = glyph_project
    folder = write_batch(batch, root / "batches" / batch.id).parent
    images = [p.image for s in batch.query_sets for p in s.images]
    split, contested = images[1], images[7]  # two to one on the first, one to one on the second
    rows = [(i, key[i], n) for n in ("ann", "bob") for i in images]
    rows += [(i, key[i], "cy") for i in images if i not in (split, contested)]
    rows += [(split, wrong(batch, split, key), "cy")]
    rows = [(i, wrong(batch, i, key) if (i, n) == (contested, "bob") else label, n) for i, label, n in rows]
    answers = tmp_path / "answers.csv"
    with open(answers, "w", newline="") as file:
        csv.writer(file).writerows([("image", "label", "annotator"), *rows])
    ingest_main(["--batch", str(folder), "--answers", str(answers), "--annotators", "2"])
    printed = capsys.readouterr().out
    assert "batch batch-001, 1 query sets (5 images)" in printed and "1 query set(s) still pending" in printed
    assert "1 disputed image(s) to review" in printed
    store = LabelStore.load(root / "labels.json")
    assert store.labels[split] == key[split] and contested not in store.labels  # 2 of 3 agree; 1 against 1
    with open(folder / "disputes.csv", newline="") as file:
        disputed = list(csv.DictReader(file))
    assert {r["image"] for r in disputed} == {contested} and {r["answer"] for r in disputed} == {
        key[contested],
        wrong(batch, contested, key),
    }
    with open(answers, "a", newline="") as file:
        csv.writer(file).writerow((contested, key[contested], "dee"))  # a third annotator settles it
    ingest_main(["--batch", str(folder), "--answers", str(answers), "--annotators", "2"])
    assert LabelStore.load(root / "labels.json").labels[contested] == key[contested]
    assert not (folder / "disputes.csv").exists()


def test_the_unanimous_rule_leaves_a_two_to_one_image_disputed(batch, glyph_project):
    key = glyph_project[1]
    answers = SimulatedAnnotator(key).answer(batch) * 2
    split = batch.query_sets[0].images[0].image
    answers.append(Answer(split, wrong(batch, split, key), "third"))
    outcome = ingest_outcome(batch, answers, "x", rule="unanimous")
    assert [d.image for d in outcome.disputes] == [split] and outcome.pending == batch.query_sets[:1]
