"""Typed configuration of a node (``swarm-node join``): one frozen section (the convention is
:mod:`swarm.config`'s), checked when built; the join flags are derived from its fields
(``node_agents/cli.py``) and ``swarm-node config`` prints it with every field's doc. What the
node decides at run time (its backend, threads, the model it fetched) gives a new config
(``dataclasses.replace``), never an assignment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from node_agents.schedule import parse_hours
from swarm.addrs import check_announce, check_p2p_addr, split_peer_id
from swarm.config import Rule, Section, setting
from swarm.discovery.identity import split_run
from swarm.proto.hello import name_problem


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "echo-swarm" / "node"


def check_node_name(name: str) -> None:
    problem = name_problem(name)
    if problem:
        raise ValueError(problem)


def _same_learner(c: NodeConfig) -> bool:
    """``--run NAME@PEERID`` and ``--learner .../p2p/ID`` must name the same learner."""
    run_id = split_run(c.run)[1] if c.run else ""
    addr_id = split_peer_id(c.learner)[1] if c.learner else ""
    if run_id and addr_id and run_id != addr_id:
        raise ValueError(f"--learner is peer {addr_id} but --run names learner {run_id}; give the learner's own address")
    return True


@dataclass(frozen=True)
class NodeConfig(Section):
    #: Full multiaddr of the learner, including ``/p2p/<peer id>``, e.g.
    #: ``/ip4/1.2.3.4/tcp/4001/p2p/12D3Koo...``; empty = find it through ``bootstrap`` and the swarm's DHT.
    learner: str = setting("", check=lambda addr: addr and check_p2p_addr(addr))
    #: Generation backend: ``auto`` (torch on a CUDA GPU, ``mlx`` on Apple Silicon, else
    #: ``llamacpp``), ``llamacpp``, ``torch`` or ``mlx``.
    backend: Literal["auto", "llamacpp", "torch", "mlx"] = "auto"
    #: Base model: empty = the run's model (fetched from the swarm once, cached by content hash);
    #: or ``default`` (the embedded SmolLM2-135M-Instruct), a path to a GGUF file, or an HF
    #: directory, which must be the run's (checked at hello). Each backend gets it in its own
    #: format, converted once and cached.
    model: str = ""
    #: llama.cpp nodes: quantisation of the GGUF they load (``keep``, ``f16``, ``q8_0``, ``q4_1``),
    #: made once with llama.cpp's quantiser and cached (``keep`` = as served).
    quant: Literal["keep", "f16", "q8_0", "q4_1"] = "keep"
    #: The largest run model this node fetches from the swarm (GB of its files); a bigger one is
    #: refused before any byte is written. 0 = no cap (the free-disk check still applies).
    max_model_gb: float = setting(64.0, ge=0)
    #: Content hash of the model this node holds (``swarm.content.model_id``; set at join).
    model_sha256: str = ""
    #: torch device (``cuda``, ``cuda:1``, ``cpu``); empty = CUDA when available, else CPU.
    device: str = ""
    #: Weight dtype of torch/mlx (``float32``, ``bfloat16``, ``float16``); empty = bf16 (fp16 if
    #: unsupported) on CUDA, fp32 on CPU and MLX.
    dtype: Literal["", "float32", "bfloat16", "float16"] = ""
    #: Identity key and scratch files live here (same peer id across restarts).
    data_dir: Path = setting(default_data_dir(), shown="$XDG_DATA_HOME/echo-swarm/node (~/.local/share/echo-swarm/node)")
    #: Multiaddr the node listens on (other nodes dial it to relay adapter chunks); all
    #: interfaces by default, advertised as the interface addresses (never 0.0.0.0).
    listen: str = "/ip4/0.0.0.0/tcp/0"
    #: Multiaddrs of any swarm members (learner or nodes), each ending in ``/p2p/<id>``, to join
    #: the DHT through; the first live one is used and the run's learner is looked up in the DHT.
    bootstrap: list[str] = setting(factory=list, check=check_p2p_addr)
    #: Run to join, as the learner prints it: ``NAME@PEERID`` (the run's name and its learner's
    #: peer id; no other learner is ever served) or just ``NAME`` (the learner is then the one
    #: pinned for NAME in ``data_dir/learner_pins.json``, else learnt once from the bootstrap peer
    #: and pinned). A learner of another run is refused. Empty = the bootstrap peer's run (or
    #: whatever run ``learner`` trains).
    run: str = setting("", check=lambda run: run and split_run(run))
    #: Extra multiaddrs to advertise (a public address or port mapping), e.g. ``/ip4/203.0.113.7/tcp/4002``.
    announce: list[str] = setting(factory=list, check=check_announce)
    #: Upload bandwidth in Mbit/s told to the learner (faster nodes sit nearer the broadcast
    #: tree's root); 0 = unknown.
    upload_mbps: float = setting(0.0, ge=0)
    #: CPU threads for generation; 0 = the physical cores this process may use, less one, at least
    #: one (``common.choosers.choose_node_threads``), so the machine's owner keeps a core.
    threads: int = setting(0, ge=0)
    #: Most CPU threads generation may use, whatever ``threads`` chose (0 = no cap).
    max_threads: int = setting(0, ge=0)
    #: The node's name, shown to the learner's operator (dashboard, ``swarm.json``, report) and in
    #: the node's own lines; at most 64 printable characters. Empty = the peer id's last 6 characters.
    name: str = setting("", check=check_node_name)
    #: CPU and disk priority: ``low`` (nice 19; on Linux also the SCHED_IDLE CPU policy and the
    #: idle I/O class, where allowed), so the machine's owner always comes first; ``normal``: as started.
    priority: Literal["low", "normal"] = "low"
    #: Pause generation while the machine runs on battery (Linux: /sys/class/power_supply;
    #: macOS: pmset); it resumes on mains power. The lease in hand is finished first.
    pause_on_battery: bool = False
    #: Daily window of local time in which the node works, ``START-END`` (``22-7``: from 22:00 to
    #: 07:00, past midnight; ``9:30-17``); outside it the node pauses after the lease in hand.
    #: Empty = always.
    hours: str = setting("", check=parse_hours)
    #: Exit when the learner's run ends (the behaviour before rejoining); by default the node
    #: waits for the learner's next run and joins it by itself.
    once: bool = False
    #: Seconds between the node's questions to the learner about what it credits the node with
    #: (kept in the data dir's record for ``swarm-node status``).
    contrib_every_s: float = setting(60.0, ge=0)
    #: Join token from the learner's operator (``swarm-learner token``), for allowlist runs.
    join_token: str = ""
    #: Most prompt groups asked for in one lease.
    max_groups: int = setting(1, ge=1)
    #: Seconds allowed for one request to the learner (long polls get this on top).
    request_timeout_s: float = setting(60.0, gt=0)
    #: Seconds allowed for a rollout push to be acknowledged: above the learner's push handler
    #: deadline (60 s, ``learner.service.PUSH_HANDLER_TIMEOUT_S``). The ack means "accepted";
    #: the learner may still re-score sampled groups afterwards (``learner/verify_queue.py``)
    #: and, if they fail, refuse this node for the rest of the run and re-issue its groups. A
    #: push that times out is re-leased to another node, so its generation is wasted.
    push_timeout_s: float = setting(90.0, gt=0)
    #: First reconnect delay after losing the learner; doubles up to ``backoff_max_s``.
    backoff_initial_s: float = setting(0.5, gt=0)
    #: Longest reconnect delay.
    backoff_max_s: float = 15.0
    #: Give up after this many consecutive failed connection attempts (0 = never).
    max_retries: int = setting(0, ge=0)
    #: Context window of the backend, tokens (prompt + completion).
    n_ctx: int = setting(2048, ge=16)
    #: Measure generation speed at join and report it in the hello.
    probe: bool = True
    #: Memory (bytes; on the command line e.g. ``300MB`` or ``2GB``) this node may use for the
    #: model; 0 = the device's. A torch/MLX node whose
    #: cap is too small for the whole model joins as a pipeline *stage* node and loads only the
    #: layer range the learner assigns (``node_agents.stage_agent``).
    max_memory_bytes: int = setting(0, ge=0)
    #: Join as a stage node even when the whole model would fit (torch/MLX only).
    stage: bool = False
    #: Dtype of hidden states a stage sends to the next one (``float32``, ``bfloat16``, ``float16``).
    wire_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    #: Serve as a circuit relay v2 for peers behind NAT (signalling and hole-punch rendezvous,
    #: capped per circuit; ``swarm.nat``): opt in on a machine others can dial.
    relay: bool = False

    rules = (Rule("run", _same_learner),
             Rule("backoff_max_s", lambda c: c.backoff_max_s >= c.backoff_initial_s, "must be >= backoff_initial_s"))
