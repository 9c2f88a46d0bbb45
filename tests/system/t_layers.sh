#!/usr/bin/env bash
# Layering: no #include points up the layers of docs/ARCHITECTURE.md (base, kernels, core, ZeRO, trainer),
# and the checker itself catches a planted upward include; the family seam likewise (check_family_seam.py).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
$PYTHON tests/tools/check_layers.py || FAILED=1
$PYTHON tests/tools/check_layers.py --self-test || FAILED=1
# The family seam: what a family owns (its shape fields, its widths, its folder's headers) stays its own.
$PYTHON tests/tools/check_family_seam.py || FAILED=1
$PYTHON tests/tools/check_family_seam.py --self-test || FAILED=1
# The repository explains itself: its code cites docs/ARCHITECTURE.md, which must exist, not a file outside it.
stale=$(grep -rln 'DESIGN\.md' base core kernels scripts tests zero.h zero.c train_gpt.cu README.md Makefile | grep -v '^tests/system/t_layers.sh$')
t_check design_doc_cited_in_repo "[ -f docs/ARCHITECTURE.md ] && [ -z '$stale' ]" "docs/ARCHITECTURE.md missing or DESIGN.md cited in: $stale"
t_finish
