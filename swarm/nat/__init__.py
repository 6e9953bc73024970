"""NAT traversal on echo-swarm's own hosts: circuit relay v2 for signalling, hole punching
(DCUtR over TCP simultaneous open) with retries and a record per pair of peers, and the checks
``swarm-node doctor`` runs (the NAT's mapping kind from two observers, dial-back).

- :mod:`swarm.nat.config`: :class:`~swarm.nat.config.NatConfig`, the knobs;
- :mod:`swarm.nat.kinds`: pure decisions (mapping kind from observations, backoff, role);
- :mod:`swarm.nat.records`: :class:`~swarm.nat.records.PunchOutcome` and the per-pair book;
- :mod:`swarm.nat.dcutr`: the project's wrapper of py-libp2p's DCUtR service;
- :mod:`swarm.nat.relay`: py-libp2p's circuit relay v2 with what it carries counted;
- :mod:`swarm.nat.service`: :class:`~swarm.nat.service.NatService` on a running host.
"""
