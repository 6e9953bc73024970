"""Signed relay instructions: who relays a version to whom, and who holds it.

The learner signs, per version, the whole broadcast layout (every stripe's tree with each
peer's addresses, and the holders to repair from) with its host's Ed25519 key, over a domain
tag and msgpack of the fields with map keys sorted (as manifests are signed, see
:mod:`swarm.chunks.manifest`). The instructions travel unchanged in every push header down the
tree. A node checks them against the learner peer id it was configured with, the run and the
version of the (separately signed) manifest, then takes its children from its own place in the
signed tree and its repair sources from the signed holders. It never follows the ``children`` /
``holders`` fields a peer wrote into a header: a peer that holds a genuine manifest can therefore
not make other nodes dial or upload to addresses of its choosing. Instructions name the layer
range of the manifest they lay out (a range's tree and holders are that range's nodes), and a
node follows them only for a manifest of the same version and range.
"""

from __future__ import annotations

from typing import Any

from swarm.chunks.manifest import ManifestError, sign, signing_payload, verify_signed
from swarm.dissem.manifest import LayerRange, describe, layers_of, range_of
from swarm.proto.dissem import Instructions, PeerRef, StripeTree, Subtree

#: Prepended to the signed bytes so these signatures cannot be replayed as another message's.
SIGNING_DOMAIN = b"echo-swarm/relay-instructions/1\x00"


def canonical_bytes(instr: Instructions) -> bytes:
    return signing_payload(instr, SIGNING_DOMAIN)


def build_instructions(run_id: str, version: int, stripes: int, roots: list[list[Subtree]],
                       holders: list[PeerRef], signer: str, layers: LayerRange = None) -> Instructions:
    """Unsigned instructions: ``roots[s]`` are the subtrees the learner feeds for stripe ``s``;
    ``layers``: the layer range of the manifest they are for (``None``: the whole adapter)."""
    return Instructions(run_id=run_id, version=version, stripes=stripes,
                        trees=[StripeTree(s, list(r)) for s, r in enumerate(roots)],
                        holders=list(holders), signer=signer, layers=layers_of(layers))


def sign_instructions(instr: Instructions, private_key: Any) -> Instructions:
    return sign(instr, SIGNING_DOMAIN, private_key)


def verify_instructions(instr: Instructions, learner_peer_id: str, run_id: str | None, version: int,
                        layers: LayerRange = None) -> None:
    """Raise :class:`ManifestError` unless ``instr`` is the learner's, for this run, version and
    layer range (``None``: the whole adapter)."""
    verify_signed(instr, SIGNING_DOMAIN, learner_peer_id, f"relay instructions for v{instr.version}")
    if run_id is not None and instr.run_id != run_id:
        raise ManifestError(f"relay instructions are for run {instr.run_id}, not {run_id}")
    if instr.version != version:
        raise ManifestError(f"relay instructions are for v{instr.version}, the manifest is v{version}")
    if range_of(instr.layers) != layers:
        raise ManifestError(f"relay instructions are for {describe(range_of(instr.layers))}, "
                            f"the manifest covers {describe(layers)}")


def find_subtree(instr: Instructions, stripe: int, peer_id: str) -> Subtree | None:
    """``peer_id``'s own place in stripe ``stripe``'s tree (``None``: not in it)."""
    stack = [t for tree in instr.trees if tree.stripe == stripe for t in tree.roots]
    while stack:
        node = stack.pop()
        if node.peer.peer_id == peer_id:
            return node
        stack.extend(node.children)
    return None


def children_of(instr: Instructions, stripe: int, peer_id: str) -> list[Subtree]:
    """Whom ``peer_id`` relays stripe ``stripe`` to, by the signed layout."""
    node = find_subtree(instr, stripe, peer_id)
    return list(node.children) if node is not None else []
