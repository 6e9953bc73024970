"""The node's base model: the run's model fetched through the swarm, or a local one checked.

``prepare_model`` runs before the backend is loaded:

1. ask the learner for the run's signed model manifest (``MODEL_MANIFEST``) and the peers
   that hold the model, and verify the signature against the learner's peer id; a llama.cpp
   node asks for the GGUF form (the learner serves one beside an HF directory: ``learner.model_serve``),
   so it never converts, and needs no torch or transformers;
2. without ``--model`` (the run's model): use the cached copy under
   ``<cache>/models/<content sha256>/`` if complete, else fetch it there chunk by chunk from
   the learner and the holders at once (the chunk layer's puller, ``swarm.content.fetch``),
   resumable after a kill,
   with a progress bar on stderr; with ``--model PATH|default``: hash the local model
   (cached by path, size and mtime) and, when it is the run's, serve it to others; a
   different model is left for the learner to refuse at hello;
3. serve the chunks this node holds to other nodes (``CHUNKS``, the host's chunk server) for
   the rest of the run (in a private run only to members: the learner's manifest reply carries
   this node's membership ticket, kept by the host's ``swarm.membership.Membership``, which
   then also decides who may read; :func:`refresh_ticket` renews it),
   and report itself as a holder (``MODEL_HAVE``);
4. put the model into the backend's format once: llama.cpp gets the GGUF (re-quantised with
   ``--quant`` and cached), or, from a learner that serves only an HF directory (or a local
   ``--model DIR``), a GGUF converted from it (``node_agents.convert``: needs torch and transformers);
   torch and MLX get their converted copies through ``node_agents.models`` (cached).
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from common.model_cache import cache_root
from swarm.chunks.choice import PullSettings
from swarm.chunks.pull import Puller
from swarm.chunks.serve import ChunkServer, chunk_server
from swarm.content.fetch import model_puller
from swarm.content.manifest import ManifestError, model_content_id, verify_model_manifest
from swarm.content.model_id import describe, short
from swarm.content.store import ModelCopy
from swarm.errors import PeerUnreachable, SwarmError
from swarm.membership import membership_of
from swarm.proto import MODEL_HAVE, MODEL_MANIFEST
from swarm.proto.model import ModelHave, ModelHaveAck, ModelManifest, ModelManifestReply, ModelManifestRequest
from swarm.wire import WireError

log = logging.getLogger("echo_swarm.node")

#: ``--quant`` choices for llama.cpp nodes (``keep``: the GGUF as the learner serves it).
QUANTS = ("keep", "f16", "q8_0", "q4_1")
#: Deadline (s) of the manifest request and holder reports.
CONTROL_TIMEOUT_S = 15.0
#: Tries of the node's report that it holds the model, and the pause after the first failure (s;
#: doubled after the second, ...).
REPORT_TRIES = 4
REPORT_PAUSE_S = 2.0


class ModelError(Exception):
    """The node cannot get a usable base model (the message says why)."""


@dataclass
class PreparedModel:
    #: What to load: a GGUF file or an HF directory (the backend converts it further if needed).
    path: Path
    #: The model as held (before any re-quantisation): also given to the tokenizer helpers.
    source: Path
    content_sha256: str
    name: str


def models_root(cache_dir: Path | None = None) -> Path:
    return cache_root(cache_dir) / "models"


def is_run_model(model: str) -> bool:
    """An empty ``--model`` (or ``run``) means: the run's model, fetched if needed."""
    return str(model) in ("", "run")


# ---------------------------------------------------------------------- progress output
class ProgressBar:
    """One status line on stderr: bytes, percent, rate and peers (redrawn on a terminal, a
    line per 10% otherwise)."""

    def __init__(self, name: str, stream=sys.stderr) -> None:
        self.name = name
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self._last = 0.0
        self._last_decile = -1

    def __call__(self, done: int, total: int, rate: float, peers: int) -> None:
        now = time.monotonic()
        pct = 100.0 * done / max(1, total)
        line = (f"model {self.name}: {done / 1e6:.1f}/{total / 1e6:.1f} MB ({pct:.0f}%) "
                f"{rate / 1e6:.1f} MB/s from {peers} peer(s)")
        if self.tty:
            if now - self._last >= 0.25 or done >= total:
                self.stream.write("\r" + line + ("\n" if done >= total else ""))
                self.stream.flush()
                self._last = now
        elif int(pct // 10) != self._last_decile:
            self._last_decile = int(pct // 10)
            self.stream.write(line + "\n")
            self.stream.flush()


# ---------------------------------------------------------------------- learner requests
def wanted_form(backend: str) -> str:
    """The model form a backend loads, asked of the learner (``""``: the model as the run gives it)."""
    return "gguf" if backend == "llamacpp" else ""


async def run_manifest(host, learner_peer: str, token: str = "", form: str = "") -> tuple[ModelManifest, list]:
    """The learner's signed model manifest and holders, of the model in ``form`` when the learner
    serves it so (:func:`wanted_form`); ``token``: the node's join token (a private run serves its
    model only to admitted peers). A private run's reply also carries the node's membership
    ticket: kept as the host's own (``swarm.membership``)."""
    reply = await host.request(learner_peer, MODEL_MANIFEST, ModelManifestRequest(token=token, form=form),
                               ModelManifestReply, timeout=CONTROL_TIMEOUT_S)
    if reply.manifest is None:
        raise ModelError(f"the learner serves no model manifest: {reply.reason or 'no reason given'}")
    try:
        verify_model_manifest(reply.manifest, learner_peer)
    except ManifestError as e:
        raise ModelError(f"the learner's model manifest does not verify: {e}") from e
    membership_of(host).hold(reply.ticket, learner_peer)
    return reply.manifest, reply.holders


async def refresh_ticket(host, learner_peer: str, token: str = "") -> None:
    """Ask the learner for a fresh membership ticket (a manifest request) when the host's is due
    (a private run's, half its life gone); failures are logged, the old ticket is kept meanwhile."""
    membership = membership_of(host)
    if not membership.due():
        return
    membership.renewing()
    try:
        await run_manifest(host, learner_peer, token)
    except (SwarmError, WireError, ModelError) as e:
        log.info("membership: could not renew this node's ticket: %s", e)


async def report_have(host, learner_peer: str, copy: ModelCopy, fetcher: Puller | None = None) -> None:
    advertised = getattr(host, "advertised_addrs", None)  # dialable ones only, never 0.0.0.0
    addrs = advertised(learner_peer) if advertised is not None else list(host.addrs)
    msg = ModelHave(copy.manifest.content_sha256, addrs[:16], copy.count(), copy.complete,
                    dict(fetcher.from_peers) if fetcher else {}, round(fetcher.fetch_s, 3) if fetcher else 0.0)
    await host.request(learner_peer, MODEL_HAVE, msg, ModelHaveAck, timeout=CONTROL_TIMEOUT_S)


# ---------------------------------------------------------------------- the whole step
#: Free disk kept beyond what a fetch needs (bytes): the node's other files and the converted copy.
DISK_MARGIN_BYTES = 512 * 2**20


def fetch_refusal(total_bytes: int, held: int, free_bytes: int, max_bytes: int) -> str | None:
    """Why a model of ``total_bytes`` must not be fetched (None: fetch it). The payload is written
    chunk by chunk, then split into the model's files, so a fetch needs up to twice the model's
    size on disk (less what an earlier, interrupted fetch already wrote), plus a margin;
    ``max_bytes`` is the node's cap (0 = none)."""
    if max_bytes and total_bytes > max_bytes:
        return (f"{total_bytes / 1e9:.2f} GB is over this node's cap of {max_bytes / 1e9:.2f} GB "
                "(--max-model-gb; 0 = no cap)")
    need = 2 * total_bytes - held + DISK_MARGIN_BYTES
    if need > free_bytes:
        return (f"needs about {need / 1e9:.2f} GB of free disk to fetch and unpack, "
                f"{free_bytes / 1e9:.2f} GB free; free some space or point ECHO_SWARM_CACHE at a bigger disk")
    return None


def held_bytes(directory: Path) -> int:
    """Bytes an interrupted fetch of this model already wrote there (its ``payload.part``)."""
    part = directory / "payload.part"
    return part.stat().st_size if part.is_file() else 0


async def prepare_model(host, learner_peer: str, cfg, server: ChunkServer | None = None,
                        settings: PullSettings | None = None) -> PreparedModel:
    """The node's model, ready for ``cfg.backend`` (see the module docstring).
    ``cfg``: a ``NodeConfig`` (``model``, ``backend``, ``quant``, ``cache_dir``)."""
    cache_dir = getattr(cfg, "cache_dir", None) or None
    server = server if server is not None else chunk_server(host)
    try:
        token = getattr(cfg, "join_token", "") or ""
        form = wanted_form(cfg.backend)
        manifest, holders = await run_manifest(host, learner_peer, token, form)
    except PeerUnreachable as e:
        if "does not serve" not in str(e):
            raise
        # A learner without the model protocols (an older one, or a test harness): a local
        # model is used unchecked; the run's model cannot be had.
        if is_run_model(cfg.model):
            raise ModelError("the learner does not serve its base model; pass --model PATH|default") from e
        log.warning("the learner does not serve its model; using the local one unchecked")
        source = _local_source(cfg.model)
        sha, _ = await trio.to_thread.run_sync(describe, source, cache_root(cache_dir))
        path = await trio.to_thread.run_sync(lambda: for_backend(source, sha, cfg.backend, cfg.quant, cache_dir))
        return PreparedModel(path, source, sha, "default" if str(cfg.model) == "default" else source.name)
    run_sha = manifest.content_sha256
    if is_run_model(cfg.model):
        root = models_root(cache_dir)
        root.mkdir(parents=True, exist_ok=True)
        cap = int(float(getattr(cfg, "max_model_gb", 0.0) or 0.0) * 1e9)
        refusal = fetch_refusal(manifest.total_bytes, held_bytes(root / run_sha), shutil.disk_usage(root).free, cap)
        if refusal:
            raise ModelError(f"model {manifest.name} (sha256 {short(run_sha)}): {refusal}")
        copy = ModelCopy(manifest, root / run_sha)
        server.add(model_content_id(manifest), copy, allow=membership_of(host).allows)
        if copy.complete:
            print(f"swarm-node: model {manifest.name} (sha256 {short(run_sha)}) is cached", file=sys.stderr, flush=True)
            fetcher = None
        else:
            have = copy.count()
            print(f"swarm-node: fetching model {manifest.name} (sha256 {short(run_sha)}, "
                  f"{manifest.total_bytes / 1e6:.1f} MB{f', resuming with {have} chunks' if have else ''}) "
                  f"from the learner and {len(holders)} holder(s)", file=sys.stderr, flush=True)

            async def holder_refs():
                return (await run_manifest(host, learner_peer, token, form))[1]

            async def report(f: Puller):
                await report_have(host, learner_peer, copy, f)

            fetcher = model_puller(host, copy, learner_peer, holder_refs, settings,
                                   progress=ProgressBar(manifest.name), report=report)
            await fetcher.run()
        path = await trio.to_thread.run_sync(copy.finish)
        await _report(host, learner_peer, copy, fetcher)
        source, sha, name = path, run_sha, manifest.name
    else:
        source = _local_source(cfg.model)
        sha, _ = await trio.to_thread.run_sync(describe, source, cache_root(cache_dir))
        name = "default" if str(cfg.model) == "default" else source.name
        if sha == run_sha:
            try:
                copy = ModelCopy(manifest, source=source)
            except FileNotFoundError as e:
                raise ModelError(str(e)) from e
            server.add(model_content_id(manifest), copy, allow=membership_of(host).allows)
            await _report(host, learner_peer, copy, None)
        else:
            log.warning("local model %s (sha256 %s) is not the run's %s (sha256 %s); the learner decides at hello "
                        "(it also accepts its model in another form it serves)", name, short(sha), manifest.name,
                        short(run_sha))
    path = await trio.to_thread.run_sync(lambda: for_backend(source, sha, cfg.backend, cfg.quant, cache_dir))
    return PreparedModel(path, source, sha, name)


async def _report(host, learner_peer: str, copy: ModelCopy, fetcher, tries: int = REPORT_TRIES) -> None:
    """Report the node's copy to the learner, again after a failure (``tries`` in all, a pause
    between them): a lost last report leaves the learner unaware that this node holds the model,
    and it then never points other nodes here."""
    for attempt in range(1, tries + 1):
        try:
            await report_have(host, learner_peer, copy, fetcher)
            return
        except (SwarmError, WireError) as e:
            if attempt == tries:
                log.warning("could not report the model to the learner (%d tries): %s", tries, e)
                return
            log.info("could not report the model to the learner (try %d of %d): %s", attempt, tries, e)
            await trio.sleep(REPORT_PAUSE_S * attempt)


def _local_source(model: str) -> Path:
    from common.default_model import resolve_gguf

    path = Path(str(model)).expanduser()
    if str(model) != "default" and path.is_dir():
        return path.resolve()
    return resolve_gguf(model).resolve()


# ---------------------------------------------------------------------- backend format
def for_backend(source: Path, sha: str, backend: str, quant: str = "keep", cache_dir: Path | None = None) -> Path:
    """What to hand the backend: llama.cpp gets a GGUF at ``quant`` (converted or re-quantised
    once, cached under ``<cache>/models/<sha>/``, under a lock: processes of one machine that
    need the same form -- nodes, the learner's replayer -- convert it once and share it); torch
    and MLX get ``source`` (their loaders convert and cache it: ``node_agents.models.resolve_for_backend``)."""
    if quant not in QUANTS:
        raise ModelError(f"unknown --quant {quant!r}; choose one of {', '.join(QUANTS)}")
    if backend != "llamacpp":
        return source
    out_dir = models_root(cache_dir) / sha
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process converting the same model: wait, then reuse
        try:
            return _gguf_for(source, sha, quant, out_dir, cache_dir)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _gguf_for(source: Path, sha: str, quant: str, out_dir: Path, cache_dir: Path | None) -> Path:
    if source.is_dir():
        from node_agents.convert import converter_missing, hf_to_gguf

        missing = converter_missing()
        if missing:
            raise ModelError(f"the model is an HF directory and this node runs llama.cpp, but converting it to GGUF "
                             f"needs {missing} (pip install 'echo-swarm[torch]'); a learner of this version serves "
                             f"its model as a GGUF too, so join without --model to fetch that")
        outtype = "f16" if quant in ("keep", "q4_1") else quant
        gguf = out_dir / f"gguf-{outtype}.gguf"
        if not gguf.is_file():
            print(f"model: converting the model to GGUF ({outtype}) once ...", file=sys.stderr, flush=True)
            try:
                hf_to_gguf(source, gguf, outtype=outtype, cache_dir=cache_dir)
            except (OSError, ValueError, RuntimeError) as e:
                raise ModelError(f"cannot convert the run's HF model to GGUF for llama.cpp: {e}") from e
        source = gguf
        if quant != "q4_1":
            return gguf
    if quant == "keep":
        return source
    out = out_dir / f"gguf-{quant}-from-{short(sha)}.gguf"
    if not out.is_file():
        print(f"model: quantising the model to {quant} once ({source.stat().st_size / 1e6:.0f} MB) ...",
              file=sys.stderr, flush=True)
        t0 = time.monotonic()
        quantize_gguf(source, out, quant)
        print(f"model: quantised to {quant} in {time.monotonic() - t0:.0f} s ({out.stat().st_size / 1e6:.0f} MB)",
              file=sys.stderr, flush=True)
    return out


def quantize_gguf(src: Path, out: Path, quant: str, threads: int = 0) -> Path:
    """llama.cpp's ``llama_model_quantize`` to ``quant`` (re-quantising a quantised GGUF), in a
    child process (``node_agents.convert quantize``: the source's pages never count in this
    process's memory), written to a temporary name and renamed when done."""
    from node_agents.convert import ConversionError, quantize_child

    try:
        quantize_child(src, out, quant, threads)
    except ConversionError as e:
        raise ModelError(str(e)) from e
    return out
