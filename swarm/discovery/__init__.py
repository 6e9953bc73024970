"""Finding the swarm from any one member: a Kademlia DHT over learner and nodes
(:mod:`swarm.discovery.dht`), run names and their DHT keys (:mod:`swarm.discovery.keys`),
the ``run-info`` request a member answers about its run, and the node's path from a list of
bootstrap addresses to its run's learner (:mod:`swarm.discovery.bootstrap`)."""
