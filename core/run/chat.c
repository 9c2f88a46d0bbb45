// chat.c: see chat.h.
#include "core/run/chat.h"

#include <errno.h>
#include <limits.h>

#include "base/common.h"
#include "core/run/generate.h"
#include "core/util/json.h"
#include "core/util/utf8.h"

static const char* const ROLE_NAMES[CHAT_ROLES] = {[CHAT_SYSTEM] = "system", [CHAT_USER] = "user", [CHAT_ASSISTANT] = "assistant"};
static const char* const FORMAT_KEYS[] = {"version", "template_sha256", "prefix", "prefix_with_system",
                                          "roles", "generation_prompt", "end_of_turn"};
#define FORMAT_KEY_COUNT (int)(sizeof(FORMAT_KEYS) / sizeof(FORMAT_KEYS[0]))

static char* copy_string(const char* s) {
    size_t n = strlen(s) + 1;
    return (char*)memcpy(xmalloc(n), s, n);
}

// The whole file, NUL-terminated; a NUL byte inside is an error (the JSON it holds could not say it).
static char* read_text(const char* path) {
    FILE* f = xfopen(path, "rb");
    char* text = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) text = (char*)xrealloc(text, cap = 2 * cap + 4096 + 1);
        size_t got = fread(text + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) fail("cannot read %s: %s", path, strerror(errno));
    if (fclose(f) != 0) fail("cannot close %s: %s", path, strerror(errno));
    text[n] = '\0';
    const char* nul = memchr(text, 0, n);
    if (nul) fail("%s: a NUL byte at byte %td", path, nul - text);
    return text;
}

// ---------- chat_format.json ----------

// A string member, copied into *out: 1, or 0 with why.
static int format_string(const Json* j, const char* key, char** out, char* why, size_t size) {
    int i = json_find(j, 0, key);
    if (i < 0) return set_why(why, size, "no \"%s\"", key);
    const char* s = json_get_string(j, i);
    if (!s) return set_why(why, size, "\"%s\" is not a string", key);
    *out = copy_string(s);
    return 1;
}

static int format_role(const Json* j, int roles, ChatRole r, ChatFormat* f, char* why, size_t size) {
    int i = json_find(j, roles, ROLE_NAMES[r]);
    if (i < 0) return set_why(why, size, "\"roles\" has no \"%s\"", ROLE_NAMES[r]);
    int before = json_first(j, i), after = before < 0 ? -1 : json_next(j, before);
    const char *b = json_get_string(j, before), *a = json_get_string(j, after);
    if (j->values[i].type != JSON_ARRAY || !b || !a || json_next(j, after) >= 0)
        return set_why(why, size, "\"roles\".\"%s\" is not a list of two strings (the text before and after a message's content)",
                       ROLE_NAMES[r]);
    f->role_text[r][0] = copy_string(b);
    f->role_text[r][1] = copy_string(a);
    return 1;
}

static int format_roles(const Json* j, ChatFormat* f, char* why, size_t size) {
    int roles = json_find(j, 0, "roles");
    if (roles < 0) return set_why(why, size, "no \"roles\"");
    if (j->values[roles].type != JSON_OBJECT) return set_why(why, size, "\"roles\" is not an object");
    for (int m = json_first(j, roles); m >= 0; m = json_next(j, m)) {
        const char* key = j->values[m].key;
        if (strcmp(key, "system") && strcmp(key, "user") && strcmp(key, "assistant"))
            return set_why(why, size, "\"roles\" has the key \"%s\": only system, user and assistant", key);
    }
    for (int r = 0; r < CHAT_ROLES; r++)
        if (!format_role(j, roles, (ChatRole)r, f, why, size)) return 0;
    return 1;
}

static int format_keys_known(const Json* j, char* why, size_t size) {
    for (int m = json_first(j, 0); m >= 0; m = json_next(j, m)) {
        int known = 0;
        for (int k = 0; k < FORMAT_KEY_COUNT; k++) known |= !strcmp(j->values[m].key, FORMAT_KEYS[k]);
        if (!known)
            return set_why(why, size, "the key \"%s\" is not one of version, template_sha256, prefix, prefix_with_system, roles, "
                           "generation_prompt, end_of_turn", j->values[m].key);
    }
    return 1;
}

static int format_fields(const Json* j, ChatFormat* f, char* why, size_t size) {
    if (j->values[0].type != JSON_OBJECT) return set_why(why, size, "the top level is not a JSON object");
    if (!format_keys_known(j, why, size)) return 0;
    long long version = 0;
    int v = json_find(j, 0, "version");
    if (v < 0) return set_why(why, size, "no \"version\"");
    if (!json_get_int(j, v, 1, 1, &version)) return set_why(why, size, "\"version\" is not 1, the version this trainer reads");
    int sha = json_find(j, 0, "template_sha256");
    if (sha >= 0 && !json_get_string(j, sha)) return set_why(why, size, "\"template_sha256\" is not a string");
    if (!format_string(j, "prefix", &f->prefix, why, size) ||
        !format_string(j, "prefix_with_system", &f->prefix_with_system, why, size) || !format_roles(j, f, why, size) ||
        !format_string(j, "generation_prompt", &f->generation_prompt, why, size) ||
        !format_string(j, "end_of_turn", &f->end_of_turn, why, size))
        return 0;
    if (!f->end_of_turn[0]) return set_why(why, size, "\"end_of_turn\" is empty");
    return 1;
}

int chat_format_parse(ChatFormat* f, const char* text, char* why, size_t size) {
    memset(f, 0, sizeof *f);
    Json j;
    char problem[256];
    if (!json_parse(&j, text, problem, sizeof problem)) {
        json_free(&j);
        return set_why(why, size, "JSON parse error: %s", problem);
    }
    int ok = format_fields(&j, f, why, size);
    json_free(&j);
    return ok;
}

void chat_format_free(ChatFormat* f) {
    free(f->prefix);
    free(f->prefix_with_system);
    for (int r = 0; r < CHAT_ROLES; r++) free(f->role_text[r][0]), free(f->role_text[r][1]);
    free(f->generation_prompt);
    free(f->end_of_turn);
    memset(f, 0, sizeof *f);
}

// ---------- the conversation ----------

void chat_conversation_add(ChatConversation* c, ChatRole role, const char* content, int line) {
    if (c->n == c->cap) c->v = (ChatMessage*)xrealloc(c->v, (size_t)(c->cap = 2 * c->cap + 4) * sizeof(ChatMessage));
    c->v[c->n++] = (ChatMessage){role, copy_string(content), line};
}

// One line's message, {"role": ..., "content": ...}: 1, or 0 with why (without the line number).
static int parse_message(ChatConversation* c, const Json* j, int line, char* why, size_t size) {
    if (j->values[0].type != JSON_OBJECT)
        return set_why(why, size, "not a JSON object: a message is {\"role\": \"user\", \"content\": \"...\"}");
    if (json_find(j, 0, "messages") >= 0)
        return set_why(why, size, "a -chat-file holds one message per line, not {\"messages\": [...]}");
    for (int m = json_first(j, 0); m >= 0; m = json_next(j, m))
        if (strcmp(j->values[m].key, "role") && strcmp(j->values[m].key, "content"))
            return set_why(why, size, "the key \"%s\" is not one of role, content", j->values[m].key);
    int r = json_find(j, 0, "role"), t = json_find(j, 0, "content");
    const char *role = json_get_string(j, r), *content = json_get_string(j, t);
    if (r < 0) return set_why(why, size, "no \"role\"");
    if (!role) return set_why(why, size, "\"role\" is not a string");
    if (t < 0) return set_why(why, size, "no \"content\"");
    if (!content) return set_why(why, size, "\"content\" is not a string");
    for (int k = 0; k < CHAT_ROLES; k++)
        if (!strcmp(role, ROLE_NAMES[k])) return chat_conversation_add(c, (ChatRole)k, content, line), 1;
    return set_why(why, size, "the role \"%s\" is not system, user or assistant", role);
}

static int is_blank(const char* s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

int chat_conversation_parse(ChatConversation* c, const char* text, char* why, size_t size) {
    char problem[256];
    int line = 0;
    for (const char* p = text; *p;) {
        size_t n = strcspn(p, "\n");
        line++;
        if (!is_blank(p, n)) {
            char* one = (char*)memcpy(xmalloc(n + 1), p, n);
            one[n] = '\0';
            Json j;
            int parsed = json_parse(&j, one, problem, sizeof problem);
            int ok = parsed && parse_message(c, &j, line, problem, sizeof problem);
            json_free(&j);
            free(one);
            if (!ok) return set_why(why, size, "line %d: %s%s", line, parsed ? "" : "JSON parse error: ", problem);
        }
        p += n + (p[n] == '\n');
    }
    return 1;
}

int chat_conversation_check(const ChatConversation* c, char* why, size_t size) {
    if (c->n == 0) return set_why(why, size, "holds no message");
    const ChatMessage* last = &c->v[c->n - 1];
    if (last->role != CHAT_USER)
        return set_why(why, size, "the last message (line %d) is the %s's: the reply answers a user's message", last->line,
                       ROLE_NAMES[last->role]);
    return 1;
}

void chat_conversation_free(ChatConversation* c) {
    for (int i = 0; i < c->n; i++) free(c->v[i].content);
    free(c->v);
    memset(c, 0, sizeof *c);
}

// ---------- rendering ----------

typedef struct {
    char* s;
    size_t n, cap;
} Text;

static void append(Text* t, const char* s) {
    size_t k = strlen(s);
    if (t->n + k + 1 > t->cap) t->s = (char*)xrealloc(t->s, t->cap = 2 * (t->n + k + 1));
    memcpy(t->s + t->n, s, k + 1);
    t->n += k;
}

char* chat_render(const ChatFormat* f, const ChatConversation* c) {
    Text t = {0};
    int first = 0;
    if (c->n > 0 && c->v[0].role == CHAT_SYSTEM) {
        append(&t, f->prefix_with_system);
        append(&t, c->v[0].content);
        append(&t, f->role_text[CHAT_SYSTEM][1]);
        first = 1;
    } else {
        append(&t, f->prefix);
    }
    for (int i = first; i < c->n; i++) {
        append(&t, f->role_text[c->v[i].role][0]);
        append(&t, c->v[i].content);
        append(&t, f->role_text[c->v[i].role][1]);
    }
    append(&t, f->generation_prompt);
    return t.s;
}

// ---------- for the trainer ----------

static void read_format(ChatFormat* f, const char* what, const char* tokenizer_path, char* path, size_t size) {
    path_beside(path, size, tokenizer_path, "chat_format.json");
    if (file_size(path) < 0)
        fail("%s needs %s, the chat template's pieces that scripts/tokenize.py --chat writes beside tokenizer.json: no "
             "such file", what, path);
    char why[512];
    char* text = read_text(path);
    if (!chat_format_parse(f, text, why, sizeof why)) fail("%s: %s", path, why);
    free(text);
}

static void read_conversation(ChatConversation* c, const char* message, const char* file) {
    char why[512];
    if (file) {
        char* text = read_text(file);
        if (!chat_conversation_parse(c, text, why, sizeof why)) fail("-chat-file %s: %s", file, why);
        free(text);
    }
    if (message) {
        size_t bad = utf8_invalid_at((const uint8_t*)message, strlen(message));
        if (bad != strlen(message)) fail("-chat is not valid UTF-8 at byte %zu", bad);
        chat_conversation_add(c, CHAT_USER, message, 0);
    }
    if (!chat_conversation_check(c, why, sizeof why)) fail("-chat-file %s: %s", file ? file : "", why);
}

// end_of_turn's one token: the reply's end.
static int end_of_turn_token(const ChatFormat* f, const char* path, const Tokenizer* tokenizer, const char* tokenizer_path,
                             int V) {
    int n = 0;
    int* ids = generate_encode_text("chat_format.json's end_of_turn", f->end_of_turn, tokenizer, tokenizer_path, V, &n);
    int id = n == 1 ? ids[0] : -1;
    free(ids);
    if (n != 1)
        fail("%s: its end_of_turn is %d tokens of %s, not one: the tokenizer lacks the template's end-of-turn token", path,
             n, tokenizer_path);
    return id;
}

ChatPrompt chat_prompt(const char* message, const char* file, const Tokenizer* tokenizer, const char* tokenizer_path,
                       int V) {
    const char* what = message ? "-chat" : "-chat-file";
    if (!tokenizer)
        fail("%s needs the tokenizer: %s does not exist (give -tk, or -i shards prepared by scripts/tokenize.py)", what,
             tokenizer_path);
    char path[PATH_MAX];
    ChatFormat f;
    read_format(&f, what, tokenizer_path, path, sizeof path);
    ChatPrompt p = {.stop = {end_of_turn_token(&f, path, tokenizer, tokenizer_path, V)}, .nstop = 1};
    int doc_start = tokenizer_eot(tokenizer);
    if (doc_start != p.stop[0] && doc_start < V) p.stop[p.nstop++] = doc_start;
    ChatConversation c = {0};
    read_conversation(&c, message, file);
    char* text = chat_render(&f, &c);
    p.ids = generate_encode_text("the rendered conversation", text, tokenizer, tokenizer_path, V, &p.n);
    free(text);
    chat_conversation_free(&c);
    chat_format_free(&f);
    return p;
}
