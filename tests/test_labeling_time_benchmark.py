"""benchmarks/labeling_time.py: labels saved at equal accuracy, and labeling-time selection rounds on a tiny model."""

import doctest
import json
import math

import pytest
import torch
from tiny_setup import QUICKSTART, TINY_QUICKSTART

from benchmarks import labeling_time as lt
from units_lightning.data import SyntheticGlyphsDataModule
from units_lightning.samplers import MarginSampler, MultiQuerySampler, RandomSampler, StochasticSampler


def test_docstring_examples():
    assert doctest.testmod(lt).failed == 0


def test_labels_to_reach_interpolates_between_rounds():
    labels = [0.0, 5.0, 10.0, 15.0]
    assert lt.labels_to_reach(labels, [60.0, 70.0, 80.0, 90.0], 75.0) == pytest.approx(7.5)
    assert lt.labels_to_reach(labels, [60.0, 70.0, 80.0, 90.0], 60.0) == 0.0
    assert lt.labels_to_reach(labels, [60.0, 70.0, 80.0, 90.0], 90.5) is None


def test_labels_saved_against_random():
    labels = [0.0, 5.0, 10.0, 15.0, 20.0]
    random = [60.0, 65.0, 70.0, 75.0, 80.0]  # reaches its final 80 at 20 labels
    faster = [60.0, 70.0, 80.0, 82.0, 83.0]  # reaches 80 at 10 labels: half the labels
    assert lt.labels_saved(labels, faster, random) == pytest.approx(0.5)
    assert lt.labels_saved(labels, random, random) == pytest.approx(0.0)
    slower = [60.0, 61.0, 62.0, 63.0, 79.0]
    assert lt.labels_saved(labels, slower, random) is None  # never reaches random's final accuracy
    # a random curve that reached its final accuracy early: the labels it needed then are the reference
    peaked = [60.0, 80.0, 78.0, 79.0, 80.0]
    assert lt.labels_saved(labels, faster, peaked) == pytest.approx(-1.0)  # twice random's labels


def test_curve_area_is_the_mean_accuracy_over_the_labels():
    assert lt.curve_area([0.0, 10.0], [50.0, 70.0]) == pytest.approx(60.0)
    assert lt.curve_area([0.0, 5.0, 10.0], [50.0, 50.0, 50.0]) == pytest.approx(50.0)


def test_summary_pairs_every_acquisition_with_random_by_seed():
    labels = [0.0, 5.0, 10.0]
    curves = {
        "random": {0: [50.0, 60.0, 70.0], 1: [52.0, 62.0, 72.0]},
        "margin": {0: [50.0, 70.0, 72.0], 1: [52.0, 72.0, 73.0]},
    }
    summary = lt.summarise(curves, labels)
    assert summary["random"]["labels_saved"]["mean"] == pytest.approx(0.0)
    assert summary["margin"]["labels_saved"]["values"] == pytest.approx([0.5, 0.5])
    # areas: random (55 + 65) / 2 = 60 and 62; margin (60 + 71) / 2 = 65.5 and 67.25
    assert summary["margin"]["area_minus_random"]["mean"] == pytest.approx((5.5 + 5.25) / 2)
    assert summary["margin"]["labels_saved"]["reached"] == "2/2"
    table = lt.markdown_table(summary)
    assert "| margin | +50.0" in table


def test_choose_takes_the_top_of_the_samplers_score():
    evidence = torch.zeros(4, 5, 3)  # 4 candidate sets of 5 queries, 3 classes
    evidence[0, :, 0] = 3.0  # vacuity 3/6, margin score 1 - (4/6 - 1/6) = 0.5
    evidence[1, :, :2] = 10.0  # two classes tied: vacuity 3/23, margin score 1 (the smallest margin)
    evidence[2, :, 0] = 10.0  # confident: vacuity 3/13, margin score 3/13
    evidence[3, :, 1] = 5.0  # vacuity 3/8, margin score 1 - 5/8
    assert lt.choose(MarginSampler(), evidence, 0.5, 1, 0).tolist() == [1]
    assert lt.choose(MultiQuerySampler(), evidence, 1.0, 2, 0).tolist() == [0, 3]  # lam 1: vacuity alone
    assert lt.choose(RandomSampler(), evidence, 0.5, 2, 0).tolist() == [0, 1]  # a random partition: its first sets
    first = lt.choose(StochasticSampler(seed=3), evidence, 0.5, 2, 5)
    assert torch.equal(first, lt.choose(StochasticSampler(seed=3), evidence, 0.5, 2, 5))
    assert len(set(first.tolist())) == 2


@pytest.mark.slow
def test_rounds_on_a_tiny_model(tmp_path):
    """A tiny untrained model through three rounds: every arm labels the same number of images a round, the
    accuracy is a percentage, and the JSON and plot are written."""
    from units_lightning.cli import cli_main

    cli = cli_main(["--config", str(QUICKSTART), *TINY_QUICKSTART, "--trainer.logger", "false"], run=False)
    ckpt = tmp_path / "tiny.ckpt"
    torch.save({"state_dict": cli.model.state_dict(), "global_step": 0, "epoch": 0}, ckpt)
    out = tmp_path / "lt.json"
    record = lt.main(
        [
            "--config", str(QUICKSTART), "--ckpt", str(ckpt), "--seeds", "0", "--split", "test", "--tasks", "2",
            "--pool", "6", "--held-out", "2", "--rounds", "2", "--device", "cpu", "--out", str(out),
            "--acquisitions", "units", "margin", *TINY_QUICKSTART,
        ]
    )  # fmt: skip
    assert set(record["curves"]) == {"random", "units", "margin"}
    for curve in (c["0"] for c in record["curves"].values()):
        assert len(curve) == 3 and all(0.0 <= a <= 100.0 and math.isfinite(a) for a in curve)
    assert json.loads(out.read_text())["labels"] == [0.0, 5.0, 10.0]
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_loss_override_reaches_the_adaptation_of_every_round(tmp_path):
    """``--model.loss.init_args.class_balanced=true`` is passed on to the model the rounds adapt with."""
    from units_lightning.cli import cli_main

    cli = cli_main(["--config", str(QUICKSTART), *TINY_QUICKSTART, "--trainer.logger", "false"], run=False)
    ckpt = tmp_path / "tiny.ckpt"
    torch.save({"state_dict": cli.model.state_dict(), "global_step": 0, "epoch": 0}, ckpt)
    override = "--model.loss.init_args.class_balanced=true"
    model, _, _ = lt.load_model(str(QUICKSTART), str(ckpt), [*TINY_QUICKSTART, override], torch.device("cpu"))
    assert model.loss.class_balanced and model.inner_loss.loss is model.loss
    assert not cli.model.loss.class_balanced  # the default: the paper's plain mean


def test_merge_joins_seeds_run_apart_and_refuses_plain_with_class_balanced_adaptation(tmp_path):
    def record(seed, overrides):
        curves = {"random": {str(seed): [50.0, 60.0, 70.0]}, "margin": {str(seed): [50.0, 70.0, 72.0]}}
        return {
            "setting": {"split": "val", "tasks": 2}, "config": "c.yaml", "labels": [0.0, 5.0, 10.0], "curves": curves,
            "checkpoints": [f"s{seed}.ckpt"], "seeds": [seed], "seconds": 1.0, "overrides": overrides,
        }  # fmt: skip

    balanced = ["--data.root", "/a", "--model.loss.init_args.class_balanced", "true"]
    paths = []
    for name, content in {
        "s0": record(0, balanced),
        "s1": record(1, ["--data.root=/b", "--model.loss.init_args.class_balanced=true"]),  # another machine's root
        "plain": record(2, ["--data.root", "/a"]),
    }.items():
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(content))
    merged = lt.merge(paths[:2], tmp_path / "merged.json")
    assert merged["seeds"] == [0, 1] and merged["summary"]["margin"]["labels_saved"]["reached"] == "2/2"
    assert lt.plot_title(merged) == "c, val classes, 2 tasks x 2 seeds, class_balanced=true"
    assert (tmp_path / "merged.png").stat().st_size > 0
    lt.merge(paths[2:], tmp_path / "plain-merged.json")
    table = lt.main(["table", f"balanced={tmp_path / 'merged.json'}", f"plain={tmp_path / 'plain-merged.json'}"])
    assert list(table["columns"]) == ["balanced", "plain"]
    lines = lt.settings_table(table["columns"]).splitlines()
    assert lines[0] == "| acquisition | balanced | plain |" and len(lines) == 3  # random, the reference: no row
    assert lines[2] == "| margin | +50 ± 0 (2/2) / +5.50 ± 0.00 | +50 (1/1) / +5.50 |"
    with pytest.raises(SystemExit):
        lt.main(["table", str(paths[2])])  # no NAME=
    with pytest.raises(ValueError, match="loss overrides"):
        lt.merge([paths[0], paths[2]], None)


def test_draw_tasks_keeps_roles_disjoint_and_classes_balanced():
    data = SyntheticGlyphsDataModule(n_way=5, k_shot=1, train_classes=20, eval_classes=10, images_per_class=12,
                                     image_size=16)  # fmt: skip
    images = data.split("test")
    setting = lt.Setting("test", tasks=3, pool=6, held_out=2, set_size=5, per_round=1, rounds=2)
    tasks = lt.draw_tasks(images, 5, 1, setting, seed=0, device=torch.device("cpu"))
    assert (
        tasks.support_x.shape[:2] == (3, 5) and tasks.pool_x.shape[:2] == (3, 30) and tasks.held_x.shape[:2] == (3, 10)
    )
    for y in (tasks.support_y, tasks.pool_y, tasks.held_y):
        assert (torch.bincount(y[0], minlength=5) == y.shape[1] // 5).all()
    with pytest.raises(ValueError, match="lower --pool or --held-out"):
        lt.draw_tasks(images, 5, 1, lt.Setting("test", 1, 20, 2, 5, 1, 2), seed=0, device=torch.device("cpu"))
