#!/usr/bin/env bash
# The tree's shape rules: the C, C++ and CUDA sources that follow .clang-format (FORMATTED; the generated
# Unicode tables excepted) are what clang-format makes of them; the README and docs/ARCHITECTURE.md stay short
# enough to read, and train_gpt.cu reads top to bottom (at most 700 lines, main at most 40).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
FORMATTED=(core/tokenizer)
if command -v clang-format > /dev/null; then
    files=$(find "${FORMATTED[@]}" \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) \
            ! -name '*_tables.h' | sort)
    unformatted=$(for f in $files; do clang-format --dry-run --Werror "$f" > /dev/null 2>&1 || echo "$f"; done)
    t_check clang_format_clean "[ -n '$files' ] && [ -z '$unformatted' ]" "not as clang-format writes them: $(echo $unformatted)"
else
    t_missing clang_format_clean "clang-format"
fi
readme=$(wc -l < README.md)
t_check readme_at_most_250_lines "[ $readme -le 250 ]" "README.md has $readme lines"
architecture=$(wc -l < docs/ARCHITECTURE.md)
t_check architecture_at_most_480_lines "[ $architecture -le 480 ]" "docs/ARCHITECTURE.md has $architecture lines"
lines=$(wc -l < train_gpt.cu)
main_lines=$(awk '/^int main\(/,/^}/' train_gpt.cu | wc -l)
t_check train_gpt_at_most_700_lines "[ $lines -le 700 ] && [ $main_lines -ge 10 ] && [ $main_lines -le 40 ]" \
    "train_gpt.cu has $lines lines, main $main_lines"
t_finish
