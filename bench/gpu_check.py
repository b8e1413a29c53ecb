"""GPU check: the agent's real NVML collector against a real PyTorch training loop, then a real inference loop.

On a machine with an NVIDIA GPU and PyTorch (CUDA build):

    .venv/bin/python bench/gpu_check.py [--seconds 60] [--out gpu_check.jsonl]

Phases: a training loop (AdamW steps on a small transformer, a checkpoint written every 15 s); a training loop
starved by its input (3 s waits for each batch, 2 s of steps, small saves); an inference loop (no_grad forward
passes at a request rate that rises and falls); a continuous-batching server (a randomly initialised decoder with a
preallocated KV-cache pool, requests from eight TCP clients joining the running batch every decode step).
Nothing is downloaded. Meanwhile the agent's
collectors (GPU via NVML, NICs, disks, host) build 10 s windows exactly as the agent does. Every window is saved
as JSONL with its phase, and the summary prints per phase what NVML reported and how the optimizer's classifier
labels the workload. First, what NVML itself answers for the reads the tests model with a stand-in (NVLink-C2C,
GPM's SM occupancy) is printed GPU by GPU, error codes included. Then the collector's driver paths are checked
on the real GPU (bench/gpu_paths.py: layout
checks that must find nothing, MPS clients attributed; a MIG change and a GPU reset only when allowed):

    .venv/bin/python bench/gpu_check.py --paths [--allow-mig-change] [--allow-reset]   # those checks alone
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent import __version__
from agent.config import AgentSettings
from agent.protocol import Birth, GpuInfo, Telemetry, TopicKind, encode, node_topic
from agent.sources import node_collectors
from agent.window import WindowBuilder
from collectors.gpu import NullGpuCollector
from optimizer.decide.classify import classify
from optimizer.decide.features import workload_features
from optimizer.ingest.fleet import Fleet

WINDOW_S = 10.0
PHASES = {  # phase → the class a right answer gives
    "training": "training",
    "loader_bound_training": "training",
    "inference": "inference",
    "llm_serving": "inference",
}


def _model(torch: object) -> object:
    from torch import nn  # type: ignore[import-not-found]

    layer = nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=8).cuda()


def _trainer(torch: Any) -> tuple[Any, Any, Any]:
    """The check's model, its optimiser and one training batch."""
    model: Any = _model(torch)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), torch.randn(32, 256, 1024, device="cuda")


def _step(torch: Any, model: Any, opt: Any, x: Any) -> None:
    """One optimiser step of the check's model in bfloat16."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def train(seconds: float, ckpt_dir: str) -> None:
    import torch  # type: ignore[import-not-found]

    model, opt, x = _trainer(torch)
    end = time.monotonic() + seconds
    next_ckpt = time.monotonic() + 15
    while time.monotonic() < end:
        _step(torch, model, opt, x)
        if time.monotonic() >= next_ckpt:
            torch.cuda.synchronize()
            torch.save(model.state_dict(), f"{ckpt_dir}/ckpt.pt")  # type: ignore[attr-defined]
            next_ckpt += 15
    torch.cuda.synchronize()


def infer(seconds: float) -> None:
    import torch  # type: ignore[import-not-found]

    model = _model(torch)
    model.eval()  # type: ignore[attr-defined]
    start = time.monotonic()
    with torch.no_grad():
        while (now := time.monotonic()) < start + seconds:
            rate = 5 + 45 * (0.5 + 0.5 * math.sin(2 * math.pi * (now - start) / 30))  # requests/s, 5..50
            batch = 1 + int(rate // 10)
            x = torch.randn(batch, 128, 1024, device="cuda", dtype=torch.bfloat16)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(x)  # type: ignore[operator]
            torch.cuda.synchronize()
            time.sleep(max(0.0, 1.0 / rate - 0.002))


def train_loader_bound(seconds: float, ckpt_dir: str) -> None:
    """Training starved by its input pipeline: the training process blocks for its next batch while the loader's
    workers decode it (3 s here), then computes for about 2 s, so all the GPU's work comes in bursts with a fixed
    period; an adapter-sized save every 20 s."""
    import torch  # type: ignore[import-not-found]

    model, opt, x = _trainer(torch)
    end = time.monotonic() + seconds
    next_save = time.monotonic() + 20
    while time.monotonic() < end:
        time.sleep(3.0)  # waiting on the DataLoader's queue
        burst = time.monotonic() + 2.0
        while time.monotonic() < burst:
            _step(torch, model, opt, x)
            torch.cuda.synchronize()
        if time.monotonic() >= next_save:
            layer = model.layers[0]  # type: ignore[attr-defined]
            torch.save(layer.state_dict(), f"{ckpt_dir}/adapter.pt")  # type: ignore[attr-defined]
            next_save += 20


def serve_llm(seconds: float, port: int) -> None:
    """A continuous-batching server in the manner of vLLM's scheduler: a KV-cache pool preallocated at start (most
    of the free memory), requests arriving over TCP joining the running batch at every decode step and leaving when
    their tokens are done. Decode reads the whole cache slice of every running request each step: memory-bound."""
    import socket
    import threading

    import torch  # type: ignore[import-not-found]

    d_model, layers, max_batch, max_ctx = 2048, 8, 64, 2048
    free, _ = torch.cuda.mem_get_info()
    per_slot = layers * 2 * max_ctx * d_model * 2  # K and V, bfloat16
    slots = max(max_batch, int(free * 0.85) // per_slot)
    kv = torch.zeros((slots, layers, 2, max_ctx, d_model), dtype=torch.bfloat16, device="cuda")
    weights = [torch.randn(d_model, d_model, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    queue: list[tuple[socket.socket, int]] = []
    lock = threading.Lock()

    def reader(conn: socket.socket) -> None:
        with conn, conn.makefile("r") as lines:
            for line in lines:
                with lock:
                    queue.append((conn, max(1, int(line.strip() or "64"))))

    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(0.5)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=reader, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    running: list[list[object]] = []  # [connection, tokens left, position]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with lock:
            while queue and len(running) < max_batch:
                conn, tokens = queue.pop(0)
                running.append([conn, tokens, 0])
        if not running:
            time.sleep(0.002)  # nothing in flight: the GPU idles
            continue
        n = len(running)
        h = torch.randn(n, d_model, device="cuda", dtype=torch.bfloat16)
        ctx = min(max_ctx, 1 + max(int(r[2]) for r in running))
        for i, w in enumerate(weights):
            k = kv[:n, i, 0, :ctx]  # (n, ctx, d): the cache slice every running request reads
            scores = torch.softmax(torch.einsum("nd,ncd->nc", h, k).float(), dim=-1).to(torch.bfloat16)
            h = torch.einsum("nc,ncd->nd", scores, kv[:n, i, 1, :ctx]) @ w
        torch.cuda.synchronize()
        for r in list(running):
            r[1] = int(r[1]) - 1  # type: ignore[call-overload]
            r[2] = int(r[2]) + 1  # type: ignore[call-overload]
            if int(r[1]) <= 0:  # type: ignore[call-overload]
                running.remove(r)
                with contextlib.suppress(OSError):
                    r[0].sendall(b"done\n")  # type: ignore[attr-defined]
    listener.close()


def clients(port: int, seconds: float, peers: int = 8) -> None:
    """Clients of the server above, each from its own loopback address (distinct peers, as a real server has),
    each with a persistent connection sending requests at a rate that rises and falls."""
    import socket
    import threading

    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                conn = socket.create_connection(
                    ("127.0.0.1", port), timeout=5, source_address=(f"127.0.0.{index + 2}", 0)
                )
                break
            except OSError:
                time.sleep(0.5)
        else:
            return
        with conn:
            start = time.monotonic()
            while (now := time.monotonic()) < stop:
                rate = (2 + 10 * (0.5 + 0.5 * math.sin(2 * math.pi * (now - start) / 40))) / peers * 8
                conn.sendall(f"{random.randint(32, 256)}\n".encode())
                time.sleep(random.expovariate(rate))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(peers)]
    for t in threads:
        t.start()


def collect(
    phase: str, seconds: float, worker: mp.Process, out: list[tuple[str, Telemetry]], birth: list[Birth]
) -> None:
    settings = AgentSettings(node="gpu-check", site="check", state_dir=Path(tempfile.mkdtemp()))
    collectors = node_collectors(settings)
    gpu = collectors[0]
    if isinstance(gpu, NullGpuCollector):
        raise SystemExit(f"no GPU to check: {gpu.reason}")
    if not birth:
        inv = gpu.inventory()
        for c in collectors[1:]:
            inv = inv.merge(c.inventory())
        birth.append(
            Birth(
                node="gpu-check",
                site="check",
                session=1,
                agent_version=__version__,
                hostname="gpu-check",
                timestamp=time.time(),
                gpus=inv.gpus,
                nics=inv.nics,
                disks=inv.disks,
                driver_version=inv.driver_version,
                cuda_version=inv.cuda_version,
                gpu_failures=inv.gpu_failures,
                attribution_warning=inv.attribution_warning,
            )
        )
    builder = WindowBuilder("gpu-check", "check", session=1)
    worker.start()
    t0 = time.monotonic()
    window_start = time.time()
    tick = 0
    while time.monotonic() - t0 < seconds and worker.is_alive():
        builder.add([s for c in collectors for s in c.sample()], time.monotonic())
        tick += 1
        if tick % int(WINDOW_S) == 0:
            workloads = [w for c in collectors for w in c.workloads()]
            end = time.time()
            out.append((phase, builder.close(len(out), window_start, end, workloads)))
            window_start = end
        time.sleep(max(0.0, t0 + tick - time.monotonic()))
    worker.join(timeout=30)
    for c in collectors:
        c.close()


def raw_reads() -> list[str]:
    """What NVML answers, GPU by GPU, for the reads tests/fake_nvml.py models: the C2C mode call, the C2C fields
    (count; link 0's status and speed) and GPM's SM occupancy (metric 3, over 0.5 s), each value or error code."""
    import pynvml

    from collectors.gpm import GpmReader
    from collectors.gpu import field_value

    def error(exc: Exception) -> str:
        return f"{type(exc).__name__} ({getattr(exc, 'value', '?')})"

    lines = []
    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                mode = f"isC2cEnabled={pynvml.nvmlDeviceGetC2cModeInfoV(handle).isC2cEnabled}"
            except (pynvml.NVMLError, AttributeError) as exc:
                mode = error(exc)
            try:
                values = pynvml.nvmlDeviceGetFieldValues(handle, [170, (171, 0), (172, 0)])
                fields = ", ".join(
                    f"{int(v.fieldId)}: {field_value(v)[0] if v.nvmlReturn == 0 else f'error {v.nvmlReturn}'}"
                    for v in values
                )
            except pynvml.NVMLError as exc:
                fields = error(exc)
            occupancy = "no GPM"
            if GpmReader.supported(pynvml, handle):
                reader = GpmReader(pynvml, handle, metrics={3: "sm_occupancy"})
                reader.read()
                time.sleep(0.5)
                occupancy = str(reader.read().get("sm_occupancy", "not returned"))
                reader.close()
            lines.append(f"  GPU {i}: C2C mode {mode}; C2C fields {fields}; GPM SM occupancy {occupancy}")
    finally:
        pynvml.nvmlShutdown()
    return lines


def _gpu_line(g: GpuInfo) -> str:
    c2c = {None: "unknown", 0: "none"}.get(g.c2c_links, f"{g.c2c_links} links up")
    if g.c2c_max_bps:
        c2c += f", {g.c2c_max_bps / 1e9:.0f} GB/s"
    line = f"  GPU {g.index}: PCIe bytes from {g.pcie_source or 'nowhere'}, NVLink links up {g.nvlink_links}, C2C {c2c}"
    if g.memory_partition or g.physical is not None:
        line += f", memory partition {g.memory_partition}, part of GPU {g.physical}"
    return line


def summarise(windows: list[tuple[str, Telemetry]], birth: Birth) -> None:
    print(
        f"GPU: {birth.gpus[0].model if birth.gpus else '?'} x{len(birth.gpus)}, driver {birth.driver_version}, "
        f"CUDA {birth.cuda_version}"
    )
    for g in birth.gpus:
        print(_gpu_line(g))
    for failure in birth.gpu_failures:
        print(f"  GPU {failure.index} cannot be read: {failure.error}")
    if birth.attribution_warning:
        print(f"  attribution: {birth.attribution_warning}")
    for phase, expected in PHASES.items():
        ws = [w for p, w in windows if p == phase]
        if not ws:
            print(f"{phase}: no windows")
            continue

        def mean_of(field: str, ws: list[Telemetry] = ws) -> str:
            vals = [getattr(g, field).mean for w in ws for g in w.gpus if getattr(g, field) is not None]
            return f"{statistics.fmean(vals):.1f}" if vals else "n/a"

        peak_write = max((d.write_bps.max for w in ws for d in w.disks if d.write_bps), default=0.0)
        print(
            f"{phase}: {len(ws)} windows; util {mean_of('util')} %, mem {mean_of('mem_used_mib')} MiB, "
            f"power {mean_of('power_w')} W, SM active {mean_of('sm_active')} %, tensor {mean_of('tensor_active')} %, "
            f"SM occupancy {mean_of('sm_occupancy')} %, C2C tx {mean_of('c2c_tx_bps')} B/s, "
            f"PCIe tx {mean_of('pcie_tx_bps')} B/s, peak disk write {peak_write / 1e6:.0f} MB/s, "
            f"XIDs {sum(g.xid_events for w in ws for g in w.gpus)}"
        )
        fleet = Fleet("fleetfit/v1")
        fleet.ingest(node_topic("fleetfit/v1", "check", "gpu-check", TopicKind.BIRTH), encode(birth))
        for w in ws:
            fleet.ingest(node_topic("fleetfit/v1", "check", "gpu-check", TopicKind.TELEMETRY), encode(w))
        for f in workload_features(fleet, "check"):
            c = classify(f)
            verdict = "as expected" if c.workload_class.value == expected else f"EXPECTED {expected}"
            print(
                f"  classified {f.id} ({f.program or f.hint}) as {c.workload_class.value} ({c.confidence:.2f}), "
                f"{verdict}: {'; '.join(c.evidence)}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="per phase")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.jsonl"))
    parser.add_argument("--paths", action="store_true", help="only the driver-path checks (bench/gpu_paths.py)")
    parser.add_argument(
        "--allow-mig-change", action="store_true", help="let the checks enable MIG on GPU 0 for a while (restored)"
    )
    parser.add_argument("--allow-reset", action="store_true", help="let the checks reset GPU 0 (nvidia-smi -r)")
    args = parser.parse_args()
    print("NVML's own answers:")
    for line in raw_reads():
        print(line)
    if args.paths:
        return _paths(args)
    try:
        import torch  # type: ignore[import-not-found]

        if not torch.cuda.is_available():
            print("PyTorch sees no CUDA device", file=sys.stderr)
            return 1
    except ImportError:
        print("PyTorch is not installed", file=sys.stderr)
        return 1
    ctx = mp.get_context("spawn")
    windows: list[tuple[str, Telemetry]] = []
    birth: list[Birth] = []
    with tempfile.TemporaryDirectory() as ckpt:
        collect("training", args.seconds, ctx.Process(target=train, args=(args.seconds, ckpt)), windows, birth)
        loader = ctx.Process(target=train_loader_bound, args=(args.seconds, ckpt))
        collect("loader_bound_training", args.seconds, loader, windows, birth)
    collect("inference", args.seconds, ctx.Process(target=infer, args=(args.seconds,)), windows, birth)
    port = 18000 + random.randrange(1000)
    clients(port, args.seconds + 30)
    collect("llm_serving", args.seconds, ctx.Process(target=serve_llm, args=(args.seconds, port)), windows, birth)
    with args.out.open("w") as fh:
        for phase, w in windows:
            fh.write(json.dumps({"phase": phase, "window": json.loads(encode(w))}) + "\n")
    summarise(windows, birth[0])
    print(f"windows saved to {args.out}")
    return _paths(args)


def _paths(args: argparse.Namespace) -> int:
    from gpu_paths import run

    results = run(args.allow_mig_change, args.allow_reset)
    return 1 if any(r.verdict == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
