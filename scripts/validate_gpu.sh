#!/usr/bin/env bash
# The GPU half of the test suite and the differential fuzzer, as run on the H200 for docs/validation/.
#
#   scripts/validate_gpu.sh install            build and install tritonpatch into the machine's python3
#   scripts/validate_gpu.sh fuzz OUT [N] [SEED] [NAME [ARG...]]
#                                              python -m tritonpatch.fuzz --gpu over N kernels (default 320) from
#                                              SEED on (default 1) x 7 pass combinations (or the fuzzer ARGs, e.g.
#                                              --carried-offsets --pipeline skip) -> OUT/NAME.{json,txt} (default
#                                              NAME: fuzz_passes_gpu)
#   scripts/validate_gpu.sh tests OUT [FILE...] every @pytest.mark.gpu test (or those of FILE...) -> OUT/gpu_tests.txt
#
# Each writes its log with a header line: GPU, torch, Triton, Python, date, commit.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

header() {
    python3 - "$@" <<'EOF'
import datetime, os, subprocess, sys, tempfile
import torch, triton


def git(*args, **kwargs):
    return subprocess.run(["git", *args], capture_output=True, text=True, **kwargs).stdout.strip()


# The tree of the files as they are (tracked and untracked, not ignored): equal to `git rev-parse
# COMMIT^{tree}` of the commit that holds them, also where the copy's HEAD is an older commit.
with tempfile.TemporaryDirectory() as scratch:
    env = dict(os.environ, GIT_INDEX_FILE=os.path.join(scratch, "index"))
    git("read-tree", "HEAD", env=env)
    git("add", "-A", ".", env=env)
    tree = git("write-tree", env=env)[:12] or "?"
commit = git("rev-parse", "--short", "HEAD") or "?"
dirty = git("status", "--porcelain", "--untracked-files=no")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"# {gpu} · torch {torch.__version__} · triton {triton.__version__} · python {sys.version.split()[0]} · "
      f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC · commit {commit}{'+changes' if dirty else ''}"
      f" · tree {tree}")
print("# command: " + " ".join(sys.argv[1:]))
EOF
}

mode=${1:?usage: scripts/validate_gpu.sh install|fuzz|tests ...}
case "$mode" in
    install)
        python3 -m pip install -q --no-build-isolation --no-deps -e .
        python3 -c "import tritonpatch.llvm as l; print('tritonpatch installed; native LLVM options:', l.available())"
        ;;
    fuzz)
        out=${2:?OUT folder}; kernels=${3:-320}; seed=${4:-1}; name=${5:-fuzz_passes_gpu}; mkdir -p "$out"
        command=(python3 -m tritonpatch.fuzz --gpu --seed "$seed" --kernels "$kernels" --jobs "$(nproc)"
                 --log "$out/$name.json" "${@:6}")
        { header "${command[@]}"; "${command[@]}"; } 2>&1 | tee "$out/$name.txt"
        ;;
    tests)
        out=${2:?OUT folder}; shift 2; mkdir -p "$out"
        command=(python3 -m pytest -p no:cacheprovider -m gpu -q -rfEs "${@:-tests}")
        { header "${command[@]}"; "${command[@]}"; } 2>&1 | tee "$out/gpu_tests.txt"
        ;;
    *)
        echo "scripts/validate_gpu.sh: unknown mode $mode (install, fuzz, tests)" >&2; exit 2
        ;;
esac
