"""Artifact fetch throughput: the grid's object store against the same file on local disk.

Same run, same file (the bundled SmolLM2 GGUF unless --file), rounds interleaved:
  local read      read the file in 1 MiB blocks (page cache warm after the first round)
  local import    ArtifactCache.import_file: read, write to staging, sha256, publish (a file:// load)
  store read      direct gets of every chunk from the object store, nothing written
  store fetch     GridArtifactSource.fetch: direct gets into staging, sha256, publish (a load from the grid)
The ratio that matters is store fetch / local import: the same cache path, only the transport differs.

    python -m bench.artifact_fetch [--rounds 3] [--file PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from bench._common import Timer, embedded_server, median
from grid.agent.artifact_fetch import GridArtifactSource
from grid.agent.artifacts import CHUNK, MIB, ArtifactCache, ensure_bundled_model, hash_file
from grid.config import GridConfig
from grid.transport.artifact_store import (
    ARTIFACT_CHUNK_SIZE,
    READ_WINDOW,
    ensure_artifact_bucket,
    put_artifact,
    read_chunks,
    stored_artifact,
)
from grid.transport.jetstream import JetStreamLog


def local_read(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            n += len(block)
    return n


async def store_read(js, sha: str) -> int:  # type: ignore[no-untyped-def]
    stored = await stored_artifact(js, sha)
    assert stored is not None
    n = 0
    async for _, data in read_chunks(js, stored):
        n += len(data)
    return n


async def main(rounds: int, file: Path | None) -> None:
    path = file or ensure_bundled_model(GridConfig.from_environ())
    size = path.stat().st_size
    sha, _ = hash_file(path)
    mb = size / MIB
    print(f"file {path.name}: {mb:.1f} MiB, chunks of {ARTIFACT_CHUNK_SIZE // 1024} KiB, {READ_WINDOW} direct gets in flight")
    with embedded_server() as server, tempfile.TemporaryDirectory(prefix="grid-bench-artifacts-") as tmp:
        log = await JetStreamLog.connect(server.url)
        js = log.client.jetstream()
        await ensure_artifact_bucket(js)
        with Timer() as t:
            await put_artifact(js, path, sha)
        print(f"push (put into the store): {mb / t.seconds:.0f} MiB/s ({t.seconds:.2f} s)")
        rates: dict[str, list[float]] = {"local read": [], "local import": [], "store read": [], "store fetch": []}
        for r in range(rounds):
            with Timer() as t:
                assert local_read(path) == size
            rates["local read"].append(mb / t.seconds)

            cache = ArtifactCache(Path(tmp) / f"import-{r}", any_file=True)
            with Timer() as t:
                out = await asyncio.to_thread(cache.import_file, path, sha, model_id="m")
            assert out.ok, out.message
            rates["local import"].append(mb / t.seconds)

            with Timer() as t:
                assert await store_read(js, sha) == size
            rates["store read"].append(mb / t.seconds)

            cache = ArtifactCache(Path(tmp) / f"fetch-{r}")
            with Timer() as t:
                out = await GridArtifactSource(js).fetch(cache, sha, None, model_id="m")
            assert out.ok and out.transferred_bytes == size, out.message
            rates["store fetch"].append(mb / t.seconds)
            for d in (f"import-{r}", f"fetch-{r}"):
                shutil.rmtree(Path(tmp) / d)
        await log.close()
    for name, values in rates.items():
        print(f"{name:13s} median {median(values):7.0f} MiB/s  (rounds: {', '.join(f'{v:.0f}' for v in values)})")
    print(f"ratio store fetch / local import: {median(rates['store fetch']) / median(rates['local import']):.2f}")
    print(f"ratio store read / local read:    {median(rates['store read']) / median(rates['local read']):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved rounds of each measurement.")
    parser.add_argument("--file", type=Path, default=None, help="File to push and fetch (default: the bundled GGUF).")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.file))
