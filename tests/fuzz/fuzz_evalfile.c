// fuzz_evalfile.c: evaluation files (-hs) through eval_file_read.
//
// Input: the file itself. Header word 64 (which the reader ignores) picks the vocabulary, 1 + its low 17
// bits, and word 65 the length limit, 1 + its low 8 bits, so the kept and dropped examples vary too. On an
// accepted file every kept example is walked through eval_example_tokens, so a wrong offset reads outside
// the token buffer and the sanitizer reports it.
#include "tests/fuzz/harness.h"

#include <limits.h>
#include <stdio.h>

#include "core/data/eval_file.h"

int main(int argc, char** argv) {
    unsigned char* in;
    size_t n;
    Harness* h = harness_begin(argc, argv, 1, &in, &n);
    int vocab = 1 + (harness_le32(in, n, 64 * 4) & 0x1FFFF), max_len = 1 + (harness_le32(in, n, 65 * 4) & 0xFF);
    char path[PATH_MAX];
    harness_write(h, "eval.bin", in, n, path);

    EvalFile ef;
    eval_file_read(&ef, path, vocab, max_len);
    if (ef.count + ef.dropped != harness_le32(in, n, 8))
        harness_bug(h, "%d kept and %d dropped of %d examples", ef.count, ef.dropped, harness_le32(in, n, 8));
    for (int i = 0; i < ef.count; i++) {
        const EvalExample* e = &ef.examples[i];
        if (e->label < 0 || e->label >= EVAL_ENDINGS) harness_bug(h, "example %d: label %d", i, e->label);
        int longest = 0;
        for (int k = -1; k < EVAL_ENDINGS; k++) {
            int len;
            const int* t = eval_example_tokens(&ef, e, k, &len);
            if (len < 1) harness_bug(h, "example %d: part %d has %d tokens", i, k, len);
            for (int j = 0; j < len; j++)
                if (t[j] < 0 || t[j] >= vocab) harness_bug(h, "example %d: token %d outside %d", i, t[j], vocab);
            if (k >= 0 && len > longest) longest = len;
        }
        if (e->context + longest > max_len) harness_bug(h, "example %d: %d tokens kept under a limit of %d", i, e->context + longest, max_len);
    }
    eval_file_free(&ef);
    return 0;
}
