// data_splits.c: see data_splits.h.
#include "core/run/data_splits.h"

#include "base/common.h"
#include "core/model/context_layout.h"

int data_document_token(const Config* cfg, const Tokenizer* tok, const char* tokenizer_path, int V) {
    if (!cfg->docmask) return -1;
    if (!tok && V <= GPT2_EOT)
        fail("-docmask 1: no tokenizer file beside the shards (%s) names a document-start token, and the model's %d tokens "
             "do not reach GPT-2's %d (give the tokenizer with -tk)", tokenizer_path, V, GPT2_EOT);
    int token = tokenizer_eot_or_gpt2(tok, V);
    if (token >= V) fail("-docmask 1: the tokenizer's document-start token %d is outside the model's vocabulary of %d", token, V);
    return token;
}

DataLoader* data_open_val(const Config* cfg, const DataLoader* train, int dp_rank, int dp, int V, const DataOptions* opt,
                          int* batches, long long* trained) {
    DataLoader* val = dataloader_open_documents(cfg->val_pattern, cfg->B, cfg->T, dp_rank, dp, 0, cfg->seed, V, opt);
    if (dataloader_has_masks(val) != dataloader_has_masks(train))
        fail("-j %s %s .mask files beside its shards and -i %s %s: both splits must be document datasets, or neither",
             cfg->val_pattern, dataloader_has_masks(val) ? "has" : "has no", cfg->train_pattern,
             dataloader_has_masks(train) ? "does" : "does not");
    long long w = dataloader_windows_per_epoch(val);
    *batches = cfg->val_batches < w ? cfg->val_batches : (int)w;
    *trained = 0;
    for (int i = 0; i < *batches; i++) *trained += dataloader_window_trained(val, i);
    if (*trained == 0)
        fail("-j %s: its first %d validation batch%s hold no trained token (no label to score)", cfg->val_pattern, *batches,
             *batches > 1 ? "es" : "");
    return val;
}

static void print_packing(const char* split, const DataLoader* dl, const Config* cfg) {
    if (!dl || !dataloader_is_packed(dl)) return;
    PackStats p = dataloader_pack_stats(dl);
    int cut = cfg->long_docs == LONG_TRUNCATE;
    if (p.long_docs)
        printf("%s: %lld of %lld documents longer than -t %d %s their first %d tokens (-long %s)\n", split, p.long_docs,
               p.docs, cfg->T, cut ? "cut to" : "left out; -long truncate keeps", cfg->T,
               cut ? "drop leaves them out" : "drop");
    printf("%s: %lld documents packed into %lld rows of -t %d (%.1f%% tokens, the rest padding): %lld windows of -b %d rows",
           split, p.docs - (cut ? 0 : p.long_docs), p.rows, cfg->T, 100.0 * (double)p.used / ((double)p.rows * cfg->T),
           p.rows / cfg->B, cfg->B);
    if (p.rows_left) printf(", %lld row%s left over unused", p.rows_left, p.rows_left > 1 ? "s" : "");
    printf("\n");
}

void data_print_packing(const DataLoader* train, const DataLoader* val, const Config* cfg) {
    print_packing("data", train, cfg);
    print_packing("validation data", val, cfg);
}

void data_keep_context(const Config* cfg, DataLoader* train, DataLoader* val, int cp, int cp_rank) {
    if (cp == 1) return;
    int ring = cfg->context_mode == CP_RING, pieces = context_pieces(ring), first[MAX_KEPT_PIECES];
    for (int i = 0; i < pieces; i++) first[i] = context_piece_start(ring, cp, cp_rank, cfg->T / cp, i);
    dataloader_keep_columns(train, pieces, first, cfg->T / cp / pieces);
    if (val) dataloader_keep_columns(val, pieces, first, cfg->T / cp / pieces);
}

Batch data_batch_create(int B, int T, const DataLoader* dl) {
    size_t bytes = (size_t)B * T * sizeof(int);
    int docs = dl && dataloader_has_documents(dl);
    Batch b = {xmalloc(bytes), xmalloc(bytes), docs ? xmalloc(bytes) : NULL, docs ? xmalloc(bytes) : NULL};
    return b;
}

void data_batch_free(Batch* b) {
    free(b->tokens), free(b->targets), free(b->pos), free(b->doc);
    memset(b, 0, sizeof *b);
}

void data_trained_rate(const DataLoader* dl, long long trained, double seconds, char* text, size_t text_size, char* json,
                       size_t json_size) {
    if (!dataloader_has_masks(dl)) return;
    size_t n = strlen(json);
    snprintf(json + n, json_size - n, ", \"trained\": %lld, \"trained_tok_s\": %.1f", trained, (double)trained / seconds);
    snprintf(text, text_size, ", %.0f trained tok/s", (double)trained / seconds);
}
