"""Fetching the base model over real libp2p hosts on 127.0.0.1 (in one process): several
peers at once, a corrupt peer's chunk refetched elsewhere, a killed fetch resumed; the hello
check; preparing a local model; re-quantisation for llama.cpp."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import trio

from learner.model_serve import hello_model_check, start_model_serve
from node_agents.model_fetch import ModelError, for_backend, prepare_model, run_manifest
from swarm.chunks.manifest import chunk_range
from swarm.chunks.serve import chunk_server
from swarm.content.fetch import FetchSettings, model_puller
from swarm.content.manifest import model_content_id
from swarm.content.model_id import content_sha256, short
from swarm.content.store import ModelCopy
from swarm.host import open_host

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
CHUNK = 32 * 1024
FAST = FetchSettings(batch=2, request_timeout_s=10, holder_refresh_s=0.2, empty_backoff_s=0.05, give_up_s=20)


@pytest.fixture
def model_file(tmp_path):
    f = tmp_path / "src" / "tiny.gguf"
    f.parent.mkdir()
    f.write_bytes(os.urandom(40 * CHUNK + 123))
    return f


class CorruptCopy(ModelCopy):
    """Serves every chunk with one byte flipped."""

    def read(self, i):
        data = super().read(i)
        return data if data is None else bytes([data[0] ^ 1]) + data[1:]


def slow(server, delay=0.05):
    """Make a chunk server answer each request ``delay`` seconds late."""
    fast = server.on_chunks

    async def on_chunks(msg, peer):
        await trio.sleep(delay)
        return await fast(msg, peer)
    server.on_chunks = on_chunks


async def holders_of(host, learner):
    return (await run_manifest(host, learner))[1]


def run_trio(fn, seconds=60):
    async def bounded():
        with trio.fail_after(seconds):
            await fn()
    trio.run(bounded)


def test_fetch_from_learner_and_a_holder_with_a_corrupt_peer(tmp_path, model_file):
    out = {}

    async def main():
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "A", listen_addr=LOOPBACK) as ah, \
                open_host(tmp_path / "B", listen_addr=LOOPBACK) as bh:
            serve = await start_model_serve(lh, model_file, "tiny", chunk_bytes=CHUNK)
            serve.server.max_reply_bytes = CHUNK  # one slow chunk per reply: A is asked before the learner is done
            slow(serve.server)
            # peer A claims the model but corrupts what it sends; it is reported as a holder
            chunk_server(ah).add(model_content_id(serve.manifest), CorruptCopy(serve.manifest, source=model_file))
            from swarm.proto.model import ModelHave
            await serve.on_have(ModelHave(serve.content_sha256, ah.addrs, 40 + 1, True), ah.peer_id)
            learner = await bh.connect(lh.addrs[0])
            manifest, holders = await run_manifest(bh, learner)
            assert [h.peer_id for h in holders] == [ah.peer_id]
            copy = ModelCopy(manifest, tmp_path / "B-store" / manifest.content_sha256)
            fetcher = model_puller(bh, copy, learner, lambda: holders_of(bh, learner), FAST)
            await fetcher.run()
            out.update(path=copy.finish(), from_peers=fetcher.from_peers, bad=fetcher.bad_peers, a=ah.peer_id,
                       learner=learner)

    run_trio(main)
    assert out["path"].read_bytes() == model_file.read_bytes()
    assert out["a"] in out["bad"], "the corrupt peer was not caught"
    assert out["from_peers"][out["learner"]] > 0


def test_two_nodes_fetch_at_once_and_trade_chunks(tmp_path, model_file):
    out = {}

    async def main():
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "A", listen_addr=LOOPBACK) as ah, \
                open_host(tmp_path / "B", listen_addr=LOOPBACK) as bh:
            serve = await start_model_serve(lh, model_file, "tiny", chunk_bytes=CHUNK)
            serve.server.max_reply_bytes = CHUNK  # one slow chunk per reply: the learner is the slow source
            slow(serve.server, 0.05)
            results = {}

            async def node(h, name):
                cfg = SimpleNamespace(model="", backend="torch", quant="keep", cache_dir=tmp_path / f"cache-{name}")
                learner = await h.connect(lh.addrs[0])
                prepared = await prepare_model(h, learner, cfg, settings=FAST)
                results[name] = prepared

            async with trio.open_nursery() as n:
                n.start_soon(node, ah, "a")
                n.start_soon(node, bh, "b")
            await serve.wait_complete(2, 10.0)  # a node's last report may land after its fetch returned
            out.update(results=results, summary=serve.summary())

    run_trio(main)
    for p in out["results"].values():
        assert p.path.read_bytes() == model_file.read_bytes() and p.content_sha256 == content_sha256(model_file)
    holders = out["summary"]["holders"]
    assert len(holders) == 2 and all(h["complete"] for h in holders.values())
    assert sum(h["chunks"] for h in holders.values()) == 2 * 41
    # between them, the two nodes got some chunks from each other rather than from the learner
    assert any(len(h["from_peers"]) >= 2 for h in holders.values()), holders


def test_a_killed_fetch_resumes_without_refetching_finished_chunks(tmp_path, model_file):
    out = {}

    async def main():
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "B", listen_addr=LOOPBACK) as bh:
            serve = await start_model_serve(lh, model_file, "tiny", chunk_bytes=CHUNK)
            learner = await bh.connect(lh.addrs[0])
            store = tmp_path / "B-store" / serve.content_sha256
            first = ModelCopy(serve.manifest, store)
            with trio.move_on_after(30) as scope:
                def kill(done, total, rate, peers):
                    if first.count() >= 10:
                        scope.cancel()
                f1 = model_puller(bh, first, learner, lambda: holders_of(bh, learner), FAST, progress=kill)
                await f1.run()
            out["held_after_kill"] = first.count()
            again = ModelCopy(serve.manifest, store)  # a new process opens the same store
            out["resumed_with"] = again.count()
            out["left"] = sum(chunk_range(serve.manifest, i)[1] for i in again.missing())
            f2 = model_puller(bh, again, learner, lambda: holders_of(bh, learner), FAST)
            await f2.run()
            out.update(second=sum(f2.from_peers.values()), path=again.finish())

    run_trio(main)
    assert 10 <= out["held_after_kill"] < 41
    assert out["resumed_with"] == out["held_after_kill"]
    assert out["second"] == out["left"] < model_file.stat().st_size - 9 * CHUNK  # only what was missing
    assert out["path"].read_bytes() == model_file.read_bytes()


def test_local_model_is_checked_and_served_only_when_it_is_the_runs(tmp_path, model_file):
    other = tmp_path / "other.gguf"
    data = model_file.read_bytes()
    other.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # another last byte, whatever it was
    out = {}

    async def main():
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "B", listen_addr=LOOPBACK) as bh:
            serve = await start_model_serve(lh, model_file, "tiny", chunk_bytes=CHUNK)
            learner = await bh.connect(lh.addrs[0])
            base = dict(backend="torch", quant="keep", cache_dir=tmp_path / "c")
            out["same"] = await prepare_model(bh, learner, SimpleNamespace(model=str(model_file), **base))
            out["holders_same"] = dict(serve.holders)
            out["other"] = await prepare_model(bh, learner, SimpleNamespace(model=str(other), **base))

    run_trio(main)
    assert out["same"].path == model_file.resolve() and len(out["holders_same"]) == 1
    assert out["other"].content_sha256 == content_sha256(other) != content_sha256(model_file)


def test_hello_check_names_both_models():
    assert hello_model_check("a" * 64, "x", "a" * 64, "run") == ""
    assert hello_model_check("", "", "", "run") == ""  # no hash known to the learner: no check
    why = hello_model_check("b" * 64, "mine.gguf", "a" * 64, "theirs.gguf")
    assert "model mismatch" in why and "mine.gguf" in why and "theirs.gguf" in why
    assert short("b" * 64) in why and short("a" * 64) in why
    assert "did not say" in hello_model_check("", "", "a" * 64, "theirs")


def test_quant_choice_is_checked(tmp_path, model_file):
    assert for_backend(model_file, "s", "torch", "q8_0", tmp_path) == model_file  # torch converts itself
    assert for_backend(model_file, "s", "llamacpp", "keep", tmp_path) == model_file
    with pytest.raises(ModelError, match="--quant"):
        for_backend(model_file, "s", "llamacpp", "q3_weird", tmp_path)


def test_llamacpp_requantises_the_default_model_once(tmp_path):
    import llama_cpp

    from common.default_model import default_gguf_path

    src = default_gguf_path()
    out = for_backend(src, "sha", "llamacpp", "q8_0", tmp_path)
    assert out.is_file() and out.stat().st_size > src.stat().st_size  # q8_0 is bigger than q4_1
    mtime = out.stat().st_mtime_ns
    assert for_backend(src, "sha", "llamacpp", "q8_0", tmp_path) == out and out.stat().st_mtime_ns == mtime
    llm = llama_cpp.Llama(str(out), n_ctx=64, verbose=False)  # llama.cpp loads it
    assert llm.n_vocab() == 49152
    llm.close()


@pytest.mark.slow
def test_an_hf_directory_model_is_fetched_and_converted_for_llamacpp(tmp_path):
    """An HF-directory run model (several files) reaches a llama.cpp node as a GGUF made by
    llama.cpp's own converter, which llama.cpp then loads."""
    import llama_cpp

    from bench.make_model import make_model

    hf = make_model("qwen3", tmp_path / "hf", "tiny")
    out = {}

    async def main():
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "B", listen_addr=LOOPBACK) as bh:
            await start_model_serve(lh, hf, "tiny-qwen3", chunk_bytes=CHUNK)
            learner = await bh.connect(lh.addrs[0])
            cfg = SimpleNamespace(model="", backend="llamacpp", quant="keep", cache_dir=tmp_path / "c")
            out["prepared"] = await prepare_model(bh, learner, cfg)

    run_trio(main, 240)
    p = out["prepared"]
    assert p.source.is_dir() and content_sha256(p.source) == content_sha256(hf) == p.content_sha256
    assert p.path.suffix == ".gguf"
    llm = llama_cpp.Llama(str(p.path), n_ctx=32, verbose=False)
    llm.close()


def test_a_learner_without_the_model_protocols_leaves_a_local_model_unchecked(tmp_path, model_file):
    out = {}

    async def main():
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "B", listen_addr=LOOPBACK) as bh:
            learner = await bh.connect(lh.addrs[0])  # serves nothing
            base = dict(backend="torch", quant="keep", cache_dir=tmp_path / "c")
            out["local"] = await prepare_model(bh, learner, SimpleNamespace(model=str(model_file), **base))
            with pytest.raises(ModelError, match="does not serve"):
                await prepare_model(bh, learner, SimpleNamespace(model="", **base))

    run_trio(main)
    assert out["local"].content_sha256 == content_sha256(model_file)


def test_a_fetch_needs_room_for_the_payload_and_the_files_and_respects_the_cap():
    from node_agents.model_fetch import DISK_MARGIN_BYTES, fetch_refusal

    gb = 10**9
    assert fetch_refusal(1 * gb, 0, 3 * gb, 64 * gb) is None
    assert "over this node's cap of 2.00 GB" in fetch_refusal(3 * gb, 0, 100 * gb, 2 * gb)
    assert fetch_refusal(3 * gb, 0, 100 * gb, 0) is None  # 0 = no cap
    tight = 2 * gb + DISK_MARGIN_BYTES
    assert "free disk" in fetch_refusal(1 * gb, 0, tight - 1, 0)
    assert fetch_refusal(1 * gb, 0, tight, 0) is None
    assert fetch_refusal(1 * gb, gb // 2, tight - gb // 2, 0) is None  # a resumed fetch needs less


def test_a_model_over_the_nodes_cap_is_refused_before_a_byte_is_written(tmp_path, model_file):
    from node_agents.cli import JOIN_FLAGS, build_parser
    from node_agents.config import NodeConfig
    from swarm.config_flags import shortcut_values

    args = build_parser().parse_args(["join", "--learner", "/ip4/127.0.0.1/tcp/1/p2p/x", "--max-model-gb", "0.5"])
    assert NodeConfig(**shortcut_values(args, JOIN_FLAGS)).max_model_gb == 0.5
    out = {}

    async def main():
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "B", listen_addr=LOOPBACK) as bh:
            await start_model_serve(lh, model_file, "tiny", chunk_bytes=CHUNK)
            learner = await bh.connect(lh.addrs[0])
            cap = model_file.stat().st_size / 2 / 1e9  # half the model
            cfg = SimpleNamespace(model="", backend="torch", quant="keep", cache_dir=tmp_path / "c", max_model_gb=cap)
            with pytest.raises(ModelError, match="over this node's cap"):
                await prepare_model(bh, learner, cfg, settings=FAST)
            out["written"] = [p for p in (tmp_path / "c").rglob("*") if p.is_file()]

    run_trio(main)
    assert out["written"] == []


def test_a_lost_holder_report_is_sent_again_and_a_lasting_failure_is_logged(caplog):
    """The report that the node holds the model is tried again after a failure (a lost last report
    would leave the learner unaware of a holder); after the last try the node says so."""
    from trio.testing import MockClock

    from node_agents.model_fetch import REPORT_TRIES, _report
    from swarm.errors import PeerUnreachable

    class FlakyHost:
        addrs = ["/ip4/127.0.0.1/tcp/1"]

        def __init__(self, failures: int):
            self.failures, self.calls = failures, 0

        async def request(self, peer, proto, msg, reply_type, timeout):
            self.calls += 1
            if self.calls <= self.failures:
                raise PeerUnreachable("stream reset")
            return reply_type()

    copy = SimpleNamespace(manifest=SimpleNamespace(content_sha256="ab" * 32), count=lambda: 3, complete=True)
    flaky, dead = FlakyHost(2), FlakyHost(99)
    trio.run(_report, flaky, "learner", copy, None, clock=MockClock(autojump_threshold=0))
    assert flaky.calls == 3
    trio.run(_report, dead, "learner", copy, None, clock=MockClock(autojump_threshold=0))
    assert dead.calls == REPORT_TRIES
    assert any("could not report the model to the learner (4 tries)" in r.getMessage() for r in caplog.records)
