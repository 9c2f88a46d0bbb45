// fuzz_tokenizer.c: tokenizer files through tokenizer_load + tokenizer_decode. The input is the file.
#include "tests/fuzz/harness.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/tokenizer/decode.h"

int main(int argc, char** argv) {
    unsigned char* in;
    size_t n;
    Harness* h = harness_begin(argc, argv, 0, &in, &n);
    Tokenizer* t = tokenizer_load(argv[1]);
    if (!t) harness_bug(h, "tokenizer_load returned NULL for a file that exists");
    int V = tokenizer_vocab(t);
    if (V < 1 || (size_t)V > n) harness_bug(h, "vocab %d from a %zu-byte file", V, n);
    // Every id, its neighbours outside the vocabulary, and the extremes: each must be a readable string
    // (strlen walks it under ASan), and the text can hold no more bytes than the file.
    size_t total = 0;
    for (long long id = -2; id <= (long long)V + 1; id++) total += strlen(tokenizer_decode(t, (int)id));
    total += strlen(tokenizer_decode(t, INT_MIN)) + strlen(tokenizer_decode(t, INT_MAX));
    total += strlen(tokenizer_decode(t, tokenizer_eot(t)));
    if (total > n) harness_bug(h, "decoded %zu bytes from a %zu-byte file", total, n);
    tokenizer_free(t);
    free(in);
    return 0;
}
