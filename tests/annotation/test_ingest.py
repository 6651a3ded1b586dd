"""Ingest: every bad input is refused with a message that names it, and a refused or interrupted ingest leaves the
label store as it was."""

from __future__ import annotations

import dataclasses
import os

import pytest

from units_lightning.annotation import IngestError, LabelStore, SimulatedAnnotator, ingest, read_answers
from units_lightning.annotation.answers import Answer
from units_lightning.annotation.batch import write_batch
from units_lightning.annotation.commands import ingest_main
from units_lightning.annotation.ingest import ingest_outcome


def two_sets(project):
    """Two query sets of 5 unlabeled images: the first of task 0, the first of task 1."""
    return [(t.name, list(t.unlabeled[:5])) for t in project.tasks[:2]]


@pytest.fixture
def batch(project, make_batch):
    return make_batch(project, two_sets(project), "batch-001")


@pytest.fixture
def answers_csv(batch, glyph_project, tmp_path):
    """The batch's CSV as a person hands it back: every label filled in from the answer key."""
    return SimulatedAnnotator(glyph_project[1]).fill_in_csv(batch, tmp_path / "answers.csv")


def rewrite(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_ingest_adds_the_labels_counts_them_and_records_the_batch(batch, answers_csv, glyph_project):
    root, key = glyph_project
    store = ingest(batch, read_answers(answers_csv), "answers.csv")
    images = [p.image for s in batch.query_sets for p in s.images]
    assert dict(store.labels) == {image: key[image] for image in images}
    assert store.ledger["query_sets"] == 2 and store.ledger["query_images"] == 10
    assert store.ledger["support_images"] == 0  # support sets are labeled by assumption, not by annotators
    assert [b.id for b in store.batches] == ["batch-001"]
    assert LabelStore.load(root / "labels.json") == store


def test_unknown_image_is_named_with_its_file_line_and_the_batch(batch, answers_csv, glyph_project):
    root, _ = glyph_project
    rewrite(answers_csv, batch.query_sets[0].images[2].image, "tasks/task-000/unlabeled/nope.png")
    with pytest.raises(IngestError) as refused:
        ingest(batch, read_answers(answers_csv), "answers.csv")
    message = str(refused.value)
    assert "answers.csv line 4: unknown image 'tasks/task-000/unlabeled/nope.png'" in message
    assert "not in batch batch-001" in message and "nothing was written" in message
    assert not (root / "labels.json").exists()


def test_an_image_of_the_project_outside_the_batch_is_unknown_to_it(batch, answers_csv, project):
    outside = project.tasks[2].unlabeled[0]
    with open(answers_csv, "a") as file:
        file.write(f"batch-001,0,{project.tasks[2].name},{outside},,,,,,,,class-0000\n")
    with pytest.raises(
        IngestError, match=f"answers.csv line 12: unknown image '{outside}': it is not in batch batch-001"
    ):
        ingest(batch, read_answers(answers_csv), "answers.csv")


def test_unknown_class_is_named_with_the_image_and_the_task_classes(batch, answers_csv, glyph_project):
    image = batch.query_sets[1].images[0].image
    rewrite(answers_csv, f",{glyph_project[1][image]}\n", ",zebra\n")
    with pytest.raises(IngestError) as refused:
        ingest(batch, read_answers(answers_csv), "answers.csv")
    task = batch.query_sets[1]
    assert f"answers.csv line 7: unknown class 'zebra' for image '{image}': task '{task.task}' has the classes " in str(
        refused.value
    )
    assert ", ".join(task.classes) in str(refused.value)


def test_two_different_answers_are_a_dispute_that_keeps_the_query_set_pending(batch, glyph_project):
    key = glyph_project[1]
    answers = [Answer(p.image, key[p.image], f"export.json task {i}") for i, p in enumerate(batch.query_sets[0].images)]
    answers += [Answer(p.image, key[p.image], "second annotator") for p in batch.query_sets[1].images]
    image = batch.query_sets[0].images[3].image
    other = next(c for c in batch.query_sets[0].classes if c != key[image])
    agreeing = Answer(batch.query_sets[1].images[0].image, key[batch.query_sets[1].images[0].image], "third annotator")
    answers += [Answer(image, other, "export.json task 9 annotation 2"), agreeing]
    outcome = ingest_outcome(batch, answers, "export.json")
    assert [d.image for d in outcome.disputes] == [image]  # the agreeing repeat is no dispute
    assert [a.where for a in outcome.disputes[0].answers] == ["export.json task 3", "export.json task 9 annotation 2"]
    assert outcome.pending == batch.query_sets[:1] and outcome.labeled == batch.query_sets[1:]
    assert set(outcome.store.labels) == {p.image for p in batch.query_sets[1].images}


def test_a_batch_ingested_twice_is_refused_and_the_store_is_unchanged(batch, answers_csv, glyph_project):
    root, _ = glyph_project
    ingest(batch, read_answers(answers_csv), "answers.csv")
    before = (root / "labels.json").read_bytes()
    with pytest.raises(IngestError, match=r"batch batch-001 was ingested already \(.*, from answers.csv\); nothing"):
        ingest(batch, read_answers(answers_csv), "answers.csv")
    assert (root / "labels.json").read_bytes() == before


def test_missing_answers_keep_their_query_set_pending_and_a_later_ingest_takes_it(batch, answers_csv, glyph_project):
    root, key = glyph_project
    complete = answers_csv.read_text()
    missing = batch.query_sets[1].images[4].image
    rewrite(answers_csv, f",{key[missing]}\n", ",\n")
    store = ingest(batch, read_answers(answers_csv), "answers.csv")
    assert set(store.labels) == {p.image for p in batch.query_sets[0].images}  # the complete set is taken
    assert store.ledger["query_sets"] == 1
    answers_csv.write_text(complete)
    store = ingest(batch, read_answers(answers_csv), "answers.csv")  # the batch again, now answered whole
    assert len(store.labels) == 10 and store.ledger["query_sets"] == 2 and len(store.batches) == 2
    with pytest.raises(IngestError, match="batch batch-001 was ingested already"):
        ingest(batch, read_answers(answers_csv), "answers.csv")
    rewrite(answers_csv, f",{key[missing]}\n", ",\n")
    other = dataclasses.replace(batch, id="batch-009")
    rewrite(answers_csv, batch.query_sets[0].images[0].image, "tasks/task-000/unlabeled/0029.png")
    with pytest.raises(IngestError, match=r"no query set is complete yet \(2 pending\); nothing was written"):
        ingest(other, [a for a in read_answers(answers_csv) if a.image in other.images], "answers.csv")


def test_an_answer_against_an_earlier_batch_is_refused(project, make_batch, glyph_project):
    key = glyph_project[1]
    first = make_batch(project, two_sets(project)[:1], "batch-001")
    ingest(first, SimulatedAnnotator(key).answer(first), "first")
    overlapping = make_batch(project, [(project.tasks[0].name, list(project.tasks[0].unlabeled[4:9]))], "batch-002")
    image = project.tasks[0].unlabeled[4]
    other = next(c for c in project.tasks[0].classes if c != key[image])
    answers = [Answer(i, other if i == image else key[i], "late.csv line 2") for i in project.tasks[0].unlabeled[4:9]]
    with pytest.raises(IngestError, match=f"image '{image}' is labeled '{other}', but batch batch-001 labeled it"):
        ingest(overlapping, answers, "late.csv")


def test_the_ledger_refuses_a_batch_beyond_the_label_budget(batch, glyph_project):
    root, key = glyph_project
    small = dataclasses.replace(batch, label_budget=1)
    with pytest.raises(
        IngestError, match="batch batch-001 holds 2 query sets, more than is left of the label budget of 1"
    ):
        ingest(small, SimulatedAnnotator(key).answer(small), "answers")
    assert not (root / "labels.json").exists()


def test_an_interrupted_write_leaves_the_previous_store_whole(batch, project, make_batch, glyph_project, monkeypatch):
    root, key = glyph_project
    ingest(batch, SimulatedAnnotator(key).answer(batch), "first")
    before = (root / "labels.json").read_bytes()
    second = make_batch(project, [(project.tasks[2].name, list(project.tasks[2].unlabeled[:5]))], "batch-002")

    def killed(source, target):
        raise KeyboardInterrupt  # the process stopped between writing the new file and renaming it

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        ingest(second, SimulatedAnnotator(key).answer(second), "second")
    monkeypatch.undo()
    assert (root / "labels.json").read_bytes() == before
    assert sorted(p.name for p in root.iterdir()) == ["labels.json", "tasks"]  # no temporary file left behind


def test_ingest_command_reads_the_batch_folder_and_the_filled_in_csv(batch, answers_csv, glyph_project, capsys):
    root, _ = glyph_project
    folder = write_batch(batch, root / "batches" / batch.id).parent
    ingest_main(["--batch", str(folder), "--answers", str(answers_csv)])
    assert "batch batch-001, 2 query sets (10 images)" in capsys.readouterr().out
    assert len(LabelStore.load(root / "labels.json").labels) == 10
    with pytest.raises(IngestError, match="batch batch-001 was ingested already"):
        ingest_main(["--batch", str(folder), "--answers", str(answers_csv)])


def test_answers_without_an_image_or_label_column_are_refused(tmp_path):
    path = tmp_path / "answers.csv"
    path.write_text("file,class\na.png,cat\n")
    with pytest.raises(ValueError, match="answers.csv has no 'image' and no 'label' column"):
        read_answers(path)
