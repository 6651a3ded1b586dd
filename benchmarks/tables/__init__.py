"""The paper's tables (issue 16): a grid of (config, method, seed) runs, each tested, tabled beside the paper.

Thin over the configs and the command line: every run is ``python -m units_lightning fit`` of a shipped config
with a method's overrides, then ``python -m units_lightning test`` of its checkpoints on the config's seeded test
tasks (600 in the shipped configs), in subprocesses:

- label-budget configs (``model.label_budget`` set; they carry a ``MilestoneCheckpoint``): the checkpoint of each
  milestone (4,000 / 8,000 / 10,000 labeled query sets), ``--ckpt_path .../milestones/labels-04000.ckpt``, those
  without results all in one process (``python -m benchmarks.tables.evaluate``, which tests each as its own
  ``test`` command does, the imports paid once; its output in ``console/test-milestones.log``);
- standard configs: the ensemble of the top-k validation checkpoints, as the paper (k is the ``save_top_k`` of the
  config's ``val/acc`` checkpoint: 1 for Omniglot, 3 for CIFAR-FS and mini-ImageNet), ``--model.ensemble``; where
  the config tests more queries a class than a training query set holds (CIFAR-FS and mini-ImageNet: 15 against 2),
  the same ensemble again with the training count, as the authors' code tests (``grid.authors_query_shots``,
  ``test/top3-val-2q``), tabled in a row of its own.

Methods are config overrides only (``METHODS``): MAML (``CrossEntropyLoss``, ``RandomSampler``), Units-NTS
(``EvidentialLoss``, ``RandomSampler``), Units-ST (``SingleTaskSelectionSampler``) and Units-ML (the config's
``MultiQuerySampler``). Every method labels the same number of query sets per step, the sampler's ``tasks`` (the
budget configs: 2), so a budget of 10,000 lasts 5,000 steps for each; Units-ST scores as many candidate query sets
per step as Units-ML (``candidates = tasks x query_sets``) and keeps the ``tasks`` most uncertain.

Each run has its folder, ``<root>/<config>/<method>/seed<k>``: a CSV logger there (no W&B needed;
``--logger config`` keeps the config's logger, the shipped configs' offline W&B, which keeps every segment, its
``save_dir`` moved there), checkpoints in ``<logger>/<version>/checkpoints/``, the ``metrics.csv`` of each earlier
fit segment in ``metrics/segment-<NN>.csv`` (Lightning's ``CSVLogger`` deletes the ``metrics.csv`` of the version
a resumed fit continues, so ``keep_metrics`` moves it there before each segment; ``run_metrics`` stitches the
whole history back together, each step once), the console output of every command in ``console/``, test results in
``test/<checkpoint>/results.json``, a record of every command (arguments, commit, device, wall time, exit status)
in ``run.json``, and ``done.json`` once every test has succeeded. Runs with ``done.json`` are skipped; any other
is continued: ``fit --ckpt_path last`` (a new run where no ``last.ckpt`` exists yet), then the tests that have no
results. Runs start seed by seed, those under way first within a seed (``launch_order``), so that short stretches
of GPU time fill one seed of every cell before the next. A folder made with other arguments (``--extra``,
``--logger``) is refused, not continued. Seed ``k``
sets ``seed_everything`` and the episode streams (``data.seed``) of training and validation; tests always use the
config's own seeds, so every run is tested on the same tasks.

Runs are packed onto the GPUs of ``--gpus``, ``--per-gpu`` K at once on each (default 1), every GPU refilled as soon
as one of its runs ends (``launcher.slots``; ``--parallel`` caps the runs at once; ``--mps`` runs them under a CUDA MPS
daemon), and a call ends by printing its runs per GPU-hour (``launcher.sweep_rate``). Each command gets its share of
the host's cores (``OMP_NUM_THREADS``, Inductor's compile workers); where Python keeps no bytecode
(``PYTHONDONTWRITEBYTECODE``, as container images often set) the commands keep theirs in ``<root>/.pycache``.

``--time-limit`` stops launching commands ``--grace`` seconds before the limit and sends SIGTERM to those still
running: a training run finishes its step, writes ``last.ckpt`` when that step is one in the middle of an epoch
with no validation after it (``units_lightning.callbacks.CheckpointOnSigterm``, which every fit has; otherwise
the ``last.ckpt`` of the last validation stands) and exits with 143; at the limit the rest are killed
(checkpoints are written atomically). The next call continues. SIGTERM to this script does the same at once.

Tables (Markdown and JSON) and plots (test accuracy against labeled query sets, one band per method) go to
``<root>/tables/``: mean and 95% confidence interval over seeds (Student t with n - 1 degrees of freedom) beside
the paper's numbers (``PAPER_SOURCE``), with the standard setting's accuracy at vacuity < 0.2 and < 0.1 and its
coverage from each ``results.json``, and Units-ML, Units-NTS and MAML against each other paired by seed
(``paired_difference``, ``report.PAIRS``).

Modules: ``reference`` (the paper's numbers), ``statistics`` (Student t, confidence intervals, paired
differences), ``grid`` (configs, methods, runs and their commands), ``folders`` (what a run's folder holds),
``metrics`` (the metrics of every fit segment), ``evaluate`` (several checkpoints tested in one process),
``launcher`` (running the grid in time), ``report`` (tables and plots), ``cli`` (the command line of
``benchmarks/paper_tables.py``).
"""
