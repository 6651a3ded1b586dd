"""``UnitsMAML(engine=...)``: the engine names as before, or an engine class that takes the backbone, from Python and
from a config's ``class_path``, whose checkpoint loads back into the same engine."""

from functools import partial

import pytest
import torch
import yaml
from tiny_setup import QUICKSTART, TINY_QUICKSTART

from units_lightning.backbones import ConvNet
from units_lightning.cli import cli_main
from units_lightning.engines import BatchedEngine, CapturingEngine, EvaluatingEngine, Learn2LearnEngine, build_engine
from units_lightning.module import UnitsMAML


def backbone() -> ConvNet:
    return ConvNet((1, 16, 16), 5, 4)


@pytest.mark.parametrize(
    ("engine", "expected"),
    [("auto", BatchedEngine), ("batched", BatchedEngine), ("learn2learn", Learn2LearnEngine)],
    ids=["auto", "batched", "learn2learn"],
)
def test_the_engine_names_build_the_engines_they_did(engine, expected):
    assert type(build_engine(backbone(), engine, inner_lr=0.3)) is expected


def test_an_engine_class_or_partial_is_called_with_the_backbone_and_its_own_options():
    net = backbone()
    built = build_engine(net, partial(Learn2LearnEngine, inner_lr=0.3, inner_lr_mode="per_parameter"), inner_lr=0.1)
    assert type(built) is Learn2LearnEngine and built.model is net
    assert (built.inner_lr.init, built.inner_lr.mode) == (0.3, "per_parameter")  # its own options, not the module's
    assert type(build_engine(backbone(), BatchedEngine)) is BatchedEngine


def test_a_built_engine_or_a_factory_of_something_else_is_refused():
    with pytest.raises(TypeError, match="built already: give its class"):
        build_engine(backbone(), BatchedEngine(backbone()))
    with pytest.raises(TypeError, match="not an engine"):
        build_engine(backbone(), lambda net: "an engine")
    with pytest.raises(ValueError, match="or an engine class"):
        build_engine(backbone(), "fastest")


def test_optional_capabilities_are_declared_protocols():
    batched, reference = BatchedEngine(backbone()), Learn2LearnEngine(backbone())
    assert isinstance(batched, CapturingEngine) and isinstance(batched, EvaluatingEngine)
    assert not isinstance(reference, CapturingEngine) and not isinstance(reference, EvaluatingEngine)


def test_an_engine_class_from_yaml_trains_and_its_checkpoint_loads_back_into_it(tmp_path):
    engine = {"class_path": "units_lightning.engines.Learn2LearnEngine", "init_args": {"inner_lr": 0.3}}
    config = tmp_path / "engine.yaml"
    config.write_text(yaml.safe_dump({"model": {"engine": engine}}))
    options = [
        *TINY_QUICKSTART,
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    cli = cli_main(["fit", "--config", str(QUICKSTART), "--config", str(config), *options])
    assert type(cli.model.engine) is Learn2LearnEngine and cli.model.engine.inner_lr.init == 0.3
    assert cli.trainer.global_step == 2 and cli.model.ledger.query_sets == 2 * 4
    (last,) = tmp_path.rglob("last.ckpt")
    loaded = UnitsMAML.load_from_checkpoint(last)
    assert type(loaded.engine) is Learn2LearnEngine and loaded.engine.inner_lr.init == 0.3
    for name, value in cli.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
