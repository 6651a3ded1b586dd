"""``SaveRunConfig``: the resolved config of a command-line run, saved with the run and sent to W&B."""

from __future__ import annotations

import lightning.pytorch as pl
import yaml
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger

from units_lightning.runs import run_directory

__all__ = ["SaveRunConfig"]


class SaveRunConfig(SaveConfigCallback):
    """Save the resolved ``units-lightning`` config into the run's own folder, and give it to W&B.

    Lightning's ``SaveConfigCallback`` writes ``config.yaml`` into ``trainer.log_dir``, which for ``WandbLogger``
    is the shared ``save_dir``: the next run overwrites it. This one writes it where the run's other files go
    (``units_lightning.runs.run_directory``): the run folder beside ``checkpoints/`` (``<save_dir>/<W&B
    project>/<run id>``, the versioned folder of ``CSVLogger`` / ``TensorBoardLogger``, or ``default_root_dir``
    without a logger). After ``fit`` with a ``WandbLogger`` the whole config also goes into the run's config under
    ``cli`` (``cli.model.lr``, ``cli.data.init_args.n_way``, ...), so runs can be filtered and grouped by any
    option; a ``test`` that continues the run leaves it as trained.

    Args:
        parser: the parser of the subcommand (given by ``LightningCLI``).
        config: the parsed config (given by ``LightningCLI``).
        config_filename: file name in the run folder.
        overwrite: replace an existing file of that name (only possible without a logger, where runs share
            ``default_root_dir``).
        multifile: keep the structure of several config files.
    """

    def __init__(
        self,
        parser: LightningArgumentParser,
        config: Namespace,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
    ) -> None:
        super().__init__(
            parser,
            config,
            config_filename=config_filename,
            overwrite=overwrite,
            multifile=multifile,
            save_to_log_dir=False,
        )

    def save_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        directory = run_directory(trainer)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / self.config_filename
        self.parser.save(self.config, str(path), skip_none=False, overwrite=self.overwrite, multifile=self.multifile)
        wandb_loggers = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
        if wandb_loggers and stage == "fit":
            resolved = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
            for logger in wandb_loggers:
                logger.experiment.config.update({"cli": resolved}, allow_val_change=True)
