#!/usr/bin/env bash
# Writes into .whl/ (git-ignored) what examples/bench/gpu.sh needs on a GPU machine that reaches no
# network: the wheels its python3 (3.12, x86-64) lacks or holds below the project's floors, MiniLM's tokenizer
# and config (random weights of its shape are built there; --weights: the real ones, as fp16, 43 MiB more), and
# the benchmark's rows and prompts (../shared/data does not travel). Run it here, in the project's virtual
# environment, where PyPI and ../shared/data are reachable; the folder then travels with the checkout.
#   bash examples/bench/gpu_wheels.sh [--weights] [--rows N] [--shared DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
git check-ignore -q .whl/ || { echo ".whl/ is not git-ignored: it must never be committed" >&2; exit 1; }
# The GPU image's python3 has torch, transformers, sentence-transformers, pyarrow, typer, rich, tqdm, pyyaml,
# pytest, hypothesis and numpy, but not pydantic nor what pydantic needs, and its transformers (5.17) is below the
# project's floor. typing-extensions is there, in a version nobody has read; pydantic needs >= 4.14.1, so a known
# one travels too. transformers travels at its floor (pyproject.toml): one pure-Python wheel (12 MiB) whose needs
# that image meets, where the newest needs a newer huggingface-hub and kernels. floors.py install puts in only
# what that python lacks or holds below a floor. datasets is imported only for saved-dataset inputs, which gpu.sh
# does not use. Versions: those tested here, and transformers' floor.
floor=$(python3 -c "import sys; sys.path.insert(0, 'examples/bench'); from floors import floors
print(next(str(r.specifier).removeprefix('>=') for r in floors() if r.name == 'transformers'))")
names="pydantic pydantic-core annotated-types typing-inspection typing-extensions"
rm -rf .whl/*.whl
mkdir -p .whl
for name in $names; do
    version=$(python3 -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$name==$version"
done
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "transformers==$floor"
python3 - .whl/*.whl <<'PY'  # what each wheel needs, to compare with the list above
import sys, zipfile
for path in sys.argv[1:]:
    with zipfile.ZipFile(path) as wheel:
        meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        lines = wheel.read(meta).decode().splitlines()
    needs = [line[15:] for line in lines if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    print(f"{path.split('/')[-1]}: needs {'; '.join(needs) or 'nothing'}")
PY
python3 examples/bench/carry.py inputs .whl "$@"
# What travels: gpu.sh reads these checkout files and .whl, at most 24 MiB together (the whole tree and .whl, at
# most 64 MiB, is what the device tool carries).
needed=$(git ls-files -co --exclude-standard -z batchinfer tests examples/bench 'examples/models/*.py' \
    examples/sms_spam pyproject.toml | xargs -0 cat | wc -c)
tree=$(git ls-files -co --exclude-standard -z | xargs -0 cat | wc -c)
wheels=$(cat .whl/*.whl | wc -c)
carried=$(du -sb .whl | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "wheels $(mib "$wheels"); .whl/ in all $(mib "$carried"); checkout files gpu.sh reads $(mib "$needed");" \
    "carried by gpu.sh $(mib $((needed + carried))) of 24 MiB; the whole tree and .whl $(mib $((tree + carried))) of 64"
[ $((tree + carried)) -le $((64 << 20)) ] || { echo "over 64 MiB: leave the weights behind" >&2; exit 1; }
[ -f .whl/minilm/model.safetensors ] || [ $((needed + carried)) -le $((24 << 20)) ] || {
    echo "over 24 MiB" >&2
    exit 1
}
