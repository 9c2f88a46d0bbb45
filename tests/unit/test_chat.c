// test_chat.c: core/run/chat.c, -chat's renderer. Llama 3.1's and Qwen2.5's (ChatML) pieces render a
// conversation as those templates do (the expected texts are written out from the templates by hand): with and
// without a system message, several turns, a system message later on; chat_format.json's refusals name the
// key, a -chat-file's name the line; a conversation must end with a user's message.
#include <stdlib.h>
#include <string.h>

#include "core/run/chat.h"
#include "tests/unit/testlib.h"

// Llama 3.1's template with its default date lines; no system message still renders the system header.
static const char* LLAMA31 =
    "{\"version\": 1, \"template_sha256\": \"ab\","
    " \"prefix\": \"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December "
    "2023\\nToday Date: 26 Jul 2024\\n\\n<|eot_id|>\","
    " \"prefix_with_system\": \"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: "
    "December 2023\\nToday Date: 26 Jul 2024\\n\\n\","
    " \"roles\": {\"system\": [\"<|start_header_id|>system<|end_header_id|>\\n\\n\", \"<|eot_id|>\"],"
    " \"user\": [\"<|start_header_id|>user<|end_header_id|>\\n\\n\", \"<|eot_id|>\"],"
    " \"assistant\": [\"<|start_header_id|>assistant<|end_header_id|>\\n\\n\", \"<|eot_id|>\"]},"
    " \"generation_prompt\": \"<|start_header_id|>assistant<|end_header_id|>\\n\\n\", \"end_of_turn\": \"<|eot_id|>\"}";

static const char* QWEN25 =
    "{\"version\": 1, \"template_sha256\": \"cd\","
    " \"prefix\": \"<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n\","
    " \"prefix_with_system\": \"<|im_start|>system\\n\","
    " \"roles\": {\"system\": [\"<|im_start|>system\\n\", \"<|im_end|>\\n\"],"
    " \"user\": [\"<|im_start|>user\\n\", \"<|im_end|>\\n\"],"
    " \"assistant\": [\"<|im_start|>assistant\\n\", \"<|im_end|>\\n\"]},"
    " \"generation_prompt\": \"<|im_start|>assistant\\n\", \"end_of_turn\": \"<|im_end|>\"}";

static const char* TURNS = "{\"role\": \"system\", \"content\": \"Be brief.\"}\n"
                           "\n"
                           "{\"role\": \"user\", \"content\": \"Hi\"}\r\n"
                           "  {\"content\": \"Hello!\", \"role\": \"assistant\"}\n"
                           "{\"role\": \"user\", \"content\": \"Why \\\"2\\\"?\\n\"}";

// The conversation of `lines` (NULL: none) and then `message` as the user's, rendered with `format`; NULL when
// either does not parse.
static char* render(const char* format, const char* lines, const char* message) {
    ChatFormat f;
    ChatConversation c = {0};
    char why[256];
    char* text = NULL;
    if (chat_format_parse(&f, format, why, sizeof why) && (!lines || chat_conversation_parse(&c, lines, why, sizeof why))) {
        if (message) chat_conversation_add(&c, CHAT_USER, message, 0);
        text = chat_render(&f, &c);
    }
    chat_format_free(&f);
    chat_conversation_free(&c);
    return text;
}

static void check_render(TestStats* st, const char* name, char* got, const char* want) {
    int same = got && !strcmp(got, want);
    if (!same) printf("# %s: rendered\n%s\n# expected\n%s\n", name, got ? got : "(nothing: a parse failed)", want);
    check_true(st, name, same);
    free(got);
}

static void renders(TestStats* st) {
    check_render(st, "llama31_one_message", render(LLAMA31, NULL, "Hi"),
                 "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                 "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check_render(st, "llama31_system_and_turns", render(LLAMA31, TURNS, NULL),
                 "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                 "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>"
                 "\n\nWhy \"2\"?\n<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    check_render(st, "qwen25_one_message", render(QWEN25, NULL, "Hi"),
                 "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    check_render(st, "qwen25_system_turns_and_message", render(QWEN25, TURNS, "And?"),
                 "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
                 "<|im_end|>\n<|im_start|>user\nWhy \"2\"?\n<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n"
                 "<|im_start|>assistant\n");
    // A system message after the first: Qwen2.5's template renders it as any other turn, after the default system.
    check_render(st, "qwen25_later_system_message",
                 render(QWEN25, "{\"role\": \"user\", \"content\": \"a\"}\n{\"role\": \"system\", \"content\": \"b\"}", "c"),
                 "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                 "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n"
                 "<|im_start|>assistant\n");
}

// QWEN25 with `from` replaced by `to` (once): refused, with `want` in the problem.
static void format_refused(TestStats* st, const char* name, const char* from, const char* to, const char* want) {
    char text[2048], why[256] = "";
    const char* at = strstr(QWEN25, from);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at ? at - QWEN25 : 0), QWEN25, to, at ? at + strlen(from) : "");
    ChatFormat f = {0};
    int ok = at && chat_format_parse(&f, text, why, sizeof why);
    chat_format_free(&f);
    int named = at && !ok && strstr(why, want);
    if (!named) printf("# %s: %s\n", name, at ? (ok ? "accepted" : why) : "the test's text is not in the format");
    check_true(st, name, named);
}

static void format_refusals(TestStats* st) {
    format_refused(st, "format_refuses_version", "\"version\": 1", "\"version\": 2", "\"version\" is not 1");
    format_refused(st, "format_refuses_no_version", "\"version\": 1,", "", "no \"version\"");
    format_refused(st, "format_refuses_no_end_of_turn", ", \"end_of_turn\": \"<|im_end|>\"", "", "no \"end_of_turn\"");
    format_refused(st, "format_refuses_empty_end_of_turn", "\"end_of_turn\": \"<|im_end|>\"", "\"end_of_turn\": \"\"",
                   "\"end_of_turn\" is empty");
    format_refused(st, "format_refuses_prefix_not_string", "\"prefix_with_system\": \"<|im_start|>system\\n\"",
                   "\"prefix_with_system\": 3", "\"prefix_with_system\" is not a string");
    format_refused(st, "format_refuses_role_not_pair", "\"user\": [\"<|im_start|>user\\n\", \"<|im_end|>\\n\"]",
                   "\"user\": [\"<|im_start|>user\\n\"]", "\"roles\".\"user\" is not a list of two strings");
    format_refused(st, "format_refuses_role_triple", "\"<|im_start|>user\\n\", \"<|im_end|>\\n\"]",
                   "\"<|im_start|>user\\n\", \"<|im_end|>\\n\", \"x\"]", "\"roles\".\"user\" is not a list of two strings");
    format_refused(st, "format_refuses_missing_role", "\"user\": [\"<|im_start|>user\\n\", \"<|im_end|>\\n\"],", "",
                   "\"roles\" has no \"user\"");
    format_refused(st, "format_refuses_other_role", "\"roles\": {", "\"roles\": {\"tool\": [\"a\", \"b\"], ",
                   "\"roles\" has the key \"tool\"");
    format_refused(st, "format_refuses_unknown_key", "\"version\": 1,", "\"version\": 1, \"bos\": \"<s>\",",
                   "the key \"bos\" is not one of");
    format_refused(st, "format_refuses_sha_not_string", "\"template_sha256\": \"cd\"", "\"template_sha256\": 1",
                   "\"template_sha256\" is not a string");
    format_refused(st, "format_refuses_bad_json", "\"version\": 1,", "\"version\": 1", "JSON parse error: ");
    format_refused(st, "format_refuses_array", QWEN25, "[1]", "the top level is not a JSON object");
}

// A -chat-file's text: refused with `want` in the problem.
static void conversation_refused(TestStats* st, const char* name, const char* text, const char* want) {
    ChatConversation c = {0};
    char why[256] = "";
    int ok = chat_conversation_parse(&c, text, why, sizeof why) && chat_conversation_check(&c, why, sizeof why);
    chat_conversation_free(&c);
    int named = !ok && strstr(why, want);
    if (!named) printf("# %s: %s\n", name, ok ? "accepted" : why);
    check_true(st, name, named);
}

static void conversation_refusals(TestStats* st) {
    const char* user = "{\"role\": \"user\", \"content\": \"a\"}\n";
    char text[512];
    conversation_refused(st, "file_refuses_empty", "\n  \n", "holds no message");
    snprintf(text, sizeof text, "%s{\"role\": \"user\", \"content\": \"a\"\n", user);
    conversation_refused(st, "file_refuses_bad_json_naming_line", text, "line 2: JSON parse error: ");
    snprintf(text, sizeof text, "%s\n[\"user\", \"a\"]\n", user);
    conversation_refused(st, "file_refuses_not_object", text, "line 3: not a JSON object");
    snprintf(text, sizeof text, "%s{\"role\": \"tool\", \"content\": \"a\"}\n", user);
    conversation_refused(st, "file_refuses_unknown_role", text, "line 2: the role \"tool\" is not system, user or assistant");
    conversation_refused(st, "file_refuses_no_role", "{\"content\": \"a\"}", "line 1: no \"role\"");
    conversation_refused(st, "file_refuses_no_content", "{\"role\": \"user\"}", "line 1: no \"content\"");
    conversation_refused(st, "file_refuses_null_content", "{\"role\": \"user\", \"content\": null}",
                         "line 1: \"content\" is not a string");
    conversation_refused(st, "file_refuses_role_not_string", "{\"role\": 1, \"content\": \"a\"}", "line 1: \"role\" is not a string");
    conversation_refused(st, "file_refuses_other_key", "{\"role\": \"user\", \"content\": \"a\", \"name\": \"b\"}",
                         "line 1: the key \"name\" is not one of role, content");
    snprintf(text, sizeof text, "%s{\"role\": \"assistant\", \"content\": \"b\"}\n", user);
    conversation_refused(st, "file_refuses_last_not_user", text, "the last message (line 2) is the assistant's");
    conversation_refused(st, "file_refuses_messages_line", "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}",
                         "line 1: a -chat-file holds one message per line, not {\"messages\": [...]}");
}

int main(void) {
    TestStats st = {0};
    renders(&st);
    format_refusals(&st);
    conversation_refusals(&st);
    return test_exit(&st);
}
