"""Which ``init_args`` a ``class_path`` change carried over, found from the command's sources (no parsing, no run)."""

import yaml
from jsonargparse import Namespace

from units_lightning.cli.config_sources import class_defaults, command_sources, inherited_arguments, reset_inherited

MULTI = "units_lightning.samplers.MultiQuerySampler"
RANDOM = "units_lightning.samplers.RandomSampler"
SINGLE = "units_lightning.samplers.SingleTaskSelectionSampler"


def _parsed(sampler: str, **init_args) -> Namespace:
    """A parsed config as jsonargparse leaves it: data (a class) holding a sampler (a class)."""
    spec = Namespace(class_path=sampler, init_args=Namespace(**init_args))
    data = Namespace(class_path="units_lightning.data.SyntheticGlyphsDataModule", init_args=Namespace(sampler=spec))
    return Namespace(data=data, model=Namespace(lr=0.002))


def _write(path, content) -> str:
    path.write_text(yaml.safe_dump(content))
    return str(path)


def test_a_later_config_file_changes_the_class_and_its_defaults_win(tmp_path):
    first = _write(
        tmp_path / "a.yaml",
        {
            "data": {
                "class_path": "units_lightning.data.SyntheticGlyphsDataModule",
                "init_args": {"sampler": {"class_path": MULTI, "init_args": {"tasks": 4, "warmup_steps": 50}}},
            }
        },
    )
    second = _write(
        tmp_path / "b.yaml", {"data": {"init_args": {"sampler": {"class_path": SINGLE, "init_args": {"tasks": 4}}}}}
    )
    config = _parsed(SINGLE, tasks=4, candidates=16, warmup_steps=50)  # what jsonargparse gives
    (found,) = inherited_arguments(["--config", first, "--config", second], config)
    assert (found.path, found.argument, found.value, found.default) == ("data.sampler", "warmup_steps", 50, 0)
    assert found.from_file and found.previous_class == MULTI
    reset_inherited(config, [found])
    assert config.data.init_args.sampler.init_args.warmup_steps == 0
    assert "takes its own default warmup_steps=0, not 50" in found.describe()


def test_an_argument_given_with_the_new_class_is_not_inherited(tmp_path):
    first = _write(
        tmp_path / "a.yaml",
        {"data": {"init_args": {"sampler": {"class_path": MULTI, "init_args": {"warmup_steps": 50}}}}},
    )
    second = _write(tmp_path / "b.yaml", {"data": {"init_args": {"sampler": {"class_path": SINGLE}}}})
    config = _parsed(SINGLE, tasks=8, candidates=16, warmup_steps=50)
    assert inherited_arguments(["--config", first, "--config", second, "--data.sampler.warmup_steps=50"], config) == []
    assert inherited_arguments(["--config", first], config) == []  # no change of class: nothing to say


def test_a_class_given_on_the_command_line_keeps_what_it_shares_and_says_so(tmp_path):
    first = _write(
        tmp_path / "a.yaml",
        {"data": {"init_args": {"sampler": {"class_path": MULTI, "init_args": {"warmup_steps": 50}}}}},
    )
    config = _parsed(SINGLE, tasks=8, candidates=16, warmup_steps=50)
    (found,) = inherited_arguments(["--config", first, "--data.sampler", SINGLE], config)
    assert not found.from_file and "keeps warmup_steps=50" in found.describe()
    reset_inherited(config, [found])
    assert config.data.init_args.sampler.init_args.warmup_steps == 50  # jsonargparse's rule stands


def test_sources_are_read_in_order_and_defaults_follow_kwargs_to_the_base_class(tmp_path):
    path = _write(tmp_path / "a.yaml", {"model": {"lr": 0.1}})
    assert command_sources(["--config", path, "--model.lr=0.2", "--trainer.fast_dev_run", "--x", "1"]) == [
        ("config", {"model": {"lr": 0.1}}),
        ("option", ("model.lr", "0.2")),
        ("option", ("trainer.fast_dev_run", None)),
        ("option", ("x", "1")),
    ]
    assert class_defaults(RANDOM) == {"tasks": 8}
    assert class_defaults("units_lightning.data.SyntheticGlyphsDataModule")["val_tasks"] == 100  # via **kwargs
    assert class_defaults("no_such_module.Thing") == {}
