// fuzz_tokenizer.c: tokenizer files through tokenizer_load + tokenizer_decode, and a tokenizer.json's model
// through bpe_encode_span. The input is the file.
#include "tests/fuzz/harness.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/tokenizer/decode.h"

// A text with what the normalizer and both passes of added tokens work on: every id must be a token.
static void encode_text(const Harness* h, const BpeModel* m) {
    static const char TEXT[] = "Hi <|endoftext|>\xcc\xb8 e\xcc\x81\xe2\x84\xab a\xcc\x82\xcc\xa3 \xe1\x84\x80\xe1\x85\xa1"
                               "\xe1\x86\xa8 \xea\xb0\x80\xe1\x86\xa8\r\n{x} 12345 \xf0\x9f\x98\x80 <|endoftext";
    BpeWorker* w = bpe_worker_new(m);
    BpeTokens ids = {0};
    if (bpe_encode_span(w, (const unsigned char*)TEXT, 0, sizeof TEXT - 1, 0, &ids) != SIZE_MAX)
        harness_bug(h, "valid UTF-8 refused");
    for (size_t i = 0; i < ids.n; i++)
        if (ids.v[i] >= m->vocab_size) harness_bug(h, "id %u past the vocabulary of %u", ids.v[i], m->vocab_size);
    free(ids.v);
    bpe_worker_free(w);
}

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
    if (tokenizer_bpe(t)) encode_text(h, tokenizer_bpe(t));
    tokenizer_free(t);
    free(in);
    return 0;
}
