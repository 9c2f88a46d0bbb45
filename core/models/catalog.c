// catalog.c: every model family, in the order -e tries their specs. See catalog.h.
#include "core/models/catalog.h"
#include "core/models/gpt2/gpt2.h"
#include "core/models/llama/llama.h"

static const ModelFamily* const FAMILIES[] = {&GPT2_FAMILY, &LLAMA_FAMILY};
#define NUM_FAMILIES (int)(sizeof(FAMILIES) / sizeof(FAMILIES[0]))

int shape_from_spec(const char* spec, ModelShape* out) {
    for (int i = 0; i < NUM_FAMILIES; i++)
        if (FAMILIES[i]->parse_spec(spec, out)) return 1;
    return 0;
}

const ModelFamily* family_of_file_id(int id) {
    for (int i = 0; i < NUM_FAMILIES; i++)
        if (FAMILIES[i]->file_id == id) return FAMILIES[i];
    return NULL;
}
