"""The ``swarm-learner`` flags that stand for a config field (``--device`` = ``--set
train.device=...``), declared once as :class:`swarm.config_flags.Shortcut` rows: their type,
choices and help come from the field. ``learner/cli.py`` adds them to its commands and
``learner/config_reference.py`` names them in ``docs/config.md``."""

from __future__ import annotations

from swarm.config_flags import Shortcut

S = Shortcut
#: ``launch``: where the learner listens, what it advertises, its run name.
NETWORK_FLAGS = (S("--listen", "network.listen", metavar="MULTIADDR"),
                 S("--announce", "network.announce", metavar="MULTIADDR"),
                 S("--bootstrap", "network.bootstrap", metavar="MULTIADDR"),
                 S("--run", "run.name", metavar="NAME"))
#: ``launch``: the device.
LAUNCH_FLAGS = (S("--device", "train.device", metavar="DEV"),)
#: ``launch`` and ``demo`` (one or the other: a mutually exclusive group).
DASHBOARD_FLAGS = (S("--dashboard", "dashboard.listen", metavar="HOST:PORT", also=(("dashboard.enabled", True),)),
                   S("--no-dashboard", "dashboard.enabled", const=False,
                     help="do not serve the live dashboard"))
#: ``demo`` and ``eval``: the task and the seeds.
TASK_FLAGS = (S("--task", "task.name", metavar="NAME"), S("--seed", ("task.seed", "train.seed")))
#: ``launch`` and ``demo``: figures also to TensorBoard / W&B (``learner/report_to.py``).
REPORT_FLAGS = (S("--report-to", "report.to", metavar="TARGET"),)
#: ``demo``: the run's length and synchronisation.
DEMO_FLAGS = (S("--steps", "train.steps"), S("--mode", "sync.mode"),
              S("--max-staleness", "sync.max_staleness", metavar="S"))

#: Every table above (for the reference: field -> flag).
ALL_FLAGS = NETWORK_FLAGS + LAUNCH_FLAGS + DASHBOARD_FLAGS + TASK_FLAGS + REPORT_FLAGS + DEMO_FLAGS
