"""Finding the swarm from any one member: a Kademlia DHT over learner and nodes
(:mod:`swarm.discovery.dht`), run names and their DHT keys (:mod:`swarm.discovery.keys`),
a run's identity (its learner's peer id and name, ``NAME@PEERID``) and the node's pinned
learners (:mod:`swarm.discovery.identity`), the ``run-info`` request a member answers about its
run, and the node's path from a list of bootstrap addresses to its run's learner, and only to it
(:mod:`swarm.discovery.bootstrap`)."""
