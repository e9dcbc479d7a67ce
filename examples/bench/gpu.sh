#!/usr/bin/env bash
# The throughput benchmark on a CUDA machine: MiniLM (embed) and a BERT-base-sized random-weight
# classifier, bf16 on the GPU. Installs what it needs into a fresh virtual environment; about 10 minutes.
#   bash examples/bench/gpu.sh [ROWS] [SHARED_DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
rows=${1:-20000}
shared=${2:-../shared/data}
python3 -m venv /tmp/batchinfer-gpu-venv
. /tmp/batchinfer-gpu-venv/bin/activate
pip install -q torch  # the CUDA build
pip install -q -e ".[test]"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python examples/bench/bench.py --device cuda --rows "$rows" --shared "$shared" --model minilm \
    --runs batchinfer,st,naive,pipeline
python examples/bench/bench.py --device cuda --rows "$rows" --shared "$shared" --model base-cls \
    --runs batchinfer,naive,pipeline
