// chat.h: -chat and -chat-file, a conversation rendered the way the model's chat template renders it, from the
// pieces scripts/tokenize.py --chat writes to chat_format.json beside tokenizer.json (docs/formats.md), then
// encoded with the trainer's tokenizer. No Jinja here: the pieces are plain text, checked by tokenize.py to
// reproduce the template.
//
// A conversation renders as
//   prefix_with_system + system's content + roles.system[1]     when its first message is a system message,
//   prefix                                                      otherwise,
// then every other message as roles[role][0] + content + roles[role][1], then generation_prompt, which opens
// the assistant's turn. The reply ends at end_of_turn's token.
//
// -chat-file: one message per line, {"role": "system"|"user"|"assistant", "content": "..."} (the keys of
// Hugging Face's and OpenAI's messages; no other key), blank lines skipped; -chat's message, when given too,
// follows the file's as the user's. The conversation ends with a user's message.
#pragma once
#include <stddef.h>

#include "core/tokenizer/decode.h"

typedef enum { CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT, CHAT_ROLES } ChatRole;

typedef struct {
    char* prefix;
    char* prefix_with_system;
    char* role_text[CHAT_ROLES][2];   // before and after a message's content
    char* generation_prompt;
    char* end_of_turn;
} ChatFormat;

typedef struct {
    ChatRole role;
    char* content;
    int line;   // in the -chat-file; 0 for -chat's message
} ChatMessage;

typedef struct {
    ChatMessage* v;
    int n, cap;
} ChatConversation;

// What -chat generates from: the conversation's ids, and the ids that end the reply.
typedef struct {
    int* ids;   // malloc'd
    int n;
    int stop[2];   // end_of_turn's token, then the tokenizer's document start
    int nstop;
} ChatPrompt;

// chat_format.json's text into f: 1, or 0 with the problem in why (the key it concerns). f is freed by
// chat_format_free either way.
int chat_format_parse(ChatFormat* f, const char* text, char* why, size_t size);
void chat_format_free(ChatFormat* f);

// Appends the messages of a -chat-file's text: 1, or 0 with the problem and its line in why ("line 3: ...").
int chat_conversation_parse(ChatConversation* c, const char* text, char* why, size_t size);
void chat_conversation_add(ChatConversation* c, ChatRole role, const char* content, int line);
// 1 when the conversation can be answered (not empty, a user's message last), else 0 with why.
int chat_conversation_check(const ChatConversation* c, char* why, size_t size);
void chat_conversation_free(ChatConversation* c);

// The conversation's text with the generation prompt, as above (malloc'd).
char* chat_render(const ChatFormat* f, const ChatConversation* c);

// For the trainer: reads chat_format.json beside the tokenizer at tokenizer_path and -chat-file `file` (NULL:
// none), appends `message` (NULL: none) as the user's, renders and encodes. end_of_turn must be one token of
// the tokenizer, every id below V. One-line errors naming the file, the line or the key.
ChatPrompt chat_prompt(const char* message, const char* file, const Tokenizer* tokenizer, const char* tokenizer_path,
                       int V);
