#!/usr/bin/env bash
# 1-bit Adam. The compressed all-reduce (core/comm/onebit.h): build/test_onebit on 1-3 ranks checks its
# identities (norm kept per compression, c + e_new = x + e_old, sign(0) = +1, the same result everywhere, the
# bytes of bits and scales), and tests/tools/onebit_oracle.py checks three rounds of every rank's results and
# errors against its own implementation of DeepSpeed's algorithm at 1e-6.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
BIN=build/test_onebit
[ -x "$BIN" ] || { t_fail onebit_binary "$BIN missing (make tests-bin)"; t_finish; }
require_mpi() { mpi_available || { t_missing "$1" "MPI (train_gpt_cpu was built without it)"; return 1; }; }

if require_mpi onebit_allreduce; then
    for np in 1 2 3; do
        mkdir -p "$TMP/dump$np"
        if "${MPIRUN[@]}" -np $np "$BIN" --dump "$TMP/dump$np" > "$TMP/unit$np.out" 2>&1 &&
            grep -q "^# test_onebit: $np ranks, [0-9]* checks, 0 failed" "$TMP/unit$np.out"; then
            t_ok "onebit_identities_np$np"
        else
            t_fail "onebit_identities_np$np" "$(grep -m3 '^FAIL\|error' "$TMP/unit$np.out" | tr '\n' ' ')"
        fi
        out=$($PYTHON tests/tools/onebit_oracle.py "$TMP/dump$np" $np 40 3 2>&1)
        case "$out" in ok*) t_ok "${out#ok }" ;; *) t_fail "onebit_oracle_np$np" "$out" ;; esac
    done
fi
t_finish
