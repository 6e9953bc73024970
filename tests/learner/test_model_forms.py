"""The run's model in two forms (``learner/model_serve.py``): an HF directory as given and the GGUF
llama.cpp nodes load, each with its own signed manifest, chunks and holders; nodes ask for the
form their backend loads and say hello with its hash. Real libp2p hosts on 127.0.0.1 in one
process; the model files are random bytes (nothing here loads them)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import trio

from learner.model_serve import hello_model_check, start_model_serve
from node_agents.model_fetch import prepare_model, run_manifest, wanted_form
from swarm.content.model_id import content_sha256
from swarm.host import open_host
from swarm.proto import MODEL_HAVE
from swarm.proto.model import ModelHave, ModelHaveAck

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
CHUNK = 32 * 1024


def hf_and_gguf(root):
    hf = root / "hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (hf / "model.safetensors").write_bytes(os.urandom(9 * CHUNK + 5))
    gguf = root / "model-f16.gguf"
    gguf.write_bytes(os.urandom(5 * CHUNK + 7))
    return hf, gguf


def test_wanted_form_is_gguf_for_llamacpp_only():
    assert wanted_form("llamacpp") == "gguf"
    assert wanted_form("torch") == wanted_form("mlx") == ""


def test_hello_accepts_the_run_model_in_any_served_form():
    run, gguf = "a" * 64, "b" * 64
    assert hello_model_check(gguf, "m.gguf", run, "hf", other_forms=[gguf]) == ""
    assert hello_model_check(run, "hf", run, "hf", other_forms=[gguf]) == ""
    assert "model mismatch" in hello_model_check("c" * 64, "x", run, "hf", other_forms=[gguf])
    assert "did not say" in hello_model_check("", "", run, "hf", other_forms=[""])  # an empty hash is no form


def test_nodes_fetch_the_form_their_backend_loads_and_holders_stay_per_form(tmp_path):
    hf, gguf = hf_and_gguf(tmp_path / "src")
    out = {}

    async def main():
        async with open_host(tmp_path / "L", listen_addr=LOOPBACK) as lh, \
                open_host(tmp_path / "A", listen_addr=LOOPBACK) as ah, \
                open_host(tmp_path / "B", listen_addr=LOOPBACK) as bh, \
                open_host(tmp_path / "C", listen_addr=LOOPBACK) as ch:
            serve = await start_model_serve(lh, hf, "hf", chunk_bytes=CHUNK, gguf=gguf)
            prepared = {}
            for name, host, backend in (("a", ah, "llamacpp"), ("c", ch, "torch")):
                cfg = SimpleNamespace(model="", backend=backend, quant="keep", cache_dir=tmp_path / f"cache-{name}")
                prepared[name] = await prepare_model(host, await host.connect(lh.addrs[0]), cfg)
            assert await serve.wait_complete(2, 10.0)  # one holder of each form: both count
            learner = await bh.connect(lh.addrs[0])
            gguf_manifest, gguf_holders = await run_manifest(bh, learner, form="gguf")
            hf_manifest, hf_holders = await run_manifest(bh, learner)
            odd_manifest, _ = await run_manifest(bh, learner, form="mlx")  # not served: the model as given
            by_sha, _ = await run_manifest(bh, learner, form="hf")
            stranger = await bh.request(learner, MODEL_HAVE, ModelHave("d" * 64, bh.addrs, 1, True), ModelHaveAck)
            out.update(prepared=prepared, gguf=(gguf_manifest, gguf_holders), hf=(hf_manifest, hf_holders),
                       odd=odd_manifest, by_sha=by_sha, stranger=stranger, a=ah.peer_id, c=ch.peer_id,
                       summary=serve.summary(), shas=serve.form_shas(), run_sha=serve.content_sha256)

    async def bounded():
        with trio.fail_after(60):
            await main()

    trio.run(bounded)
    a, c = out["prepared"]["a"], out["prepared"]["c"]
    # the llama.cpp node holds the GGUF byte for byte, under the GGUF's hash; the torch node the HF directory
    assert a.path.read_bytes() == gguf.read_bytes() and a.content_sha256 == content_sha256(gguf)
    assert c.path.is_dir() and (c.path / "model.safetensors").read_bytes() == (hf / "model.safetensors").read_bytes()
    assert c.content_sha256 == content_sha256(hf) == out["run_sha"]
    assert out["shas"] == [content_sha256(gguf)]
    assert out["gguf"][0].kind == "gguf" and out["hf"][0].kind == "hf" and out["odd"].kind == "hf"
    assert out["by_sha"].kind == "hf"
    # each form names only its own holders
    assert [h.peer_id for h in out["gguf"][1]] == [out["a"]]
    assert [h.peer_id for h in out["hf"][1]] == [out["c"]]
    s = out["summary"]
    assert s["kind"] == "hf" and list(s["holders"]) == [out["c"]]
    assert list(s["forms"]["gguf"]["holders"]) == [out["a"]] and s["forms"]["gguf"]["holders"][out["a"]]["complete"]
    assert not out["stranger"].ok  # a report of a model this run does not serve
