// child_testlib.h: a check that some code refuses bad input the way the trainer promises, one line on stderr
// and exit status 1, run in a forked child so the refusal's exit does not end the test program.
#pragma once
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/common.h"
#include "tests/unit/testlib.h"

// A child process's body; it ends in _exit, in fail() (exit 1), or by returning (exit 0).
typedef void (*ChildBody)(const void* arg);

// fail() exits without freeing by design, so under LeakSanitizer (tests/system/t_sanitize.sh) what a child
// allocated is not a leak. Weak: absent from builds without the sanitizer.
void __lsan_disable(void) __attribute__((weak));

// Runs body(arg) in a child; returns its wait status, and its stderr (at most size - 1 bytes, the rest read
// and dropped so the child never blocks on a full pipe) NUL-terminated in msg.
static inline int run_in_child(ChildBody body, const void* arg, char* msg, size_t size) {
    int fds[2];
    if (pipe(fds) != 0) fail("pipe failed");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) fail("fork failed");
    if (pid == 0) {
        if (__lsan_disable) __lsan_disable();
        if (dup2(fds[1], 2) < 0) _exit(99);
        close(fds[0]);
        body(arg);
        fflush(stdout);
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    char drop[256];
    for (ssize_t got;;) {
        if (len < size - 1) got = read(fds[0], msg + len, size - 1 - len);
        else got = read(fds[0], drop, sizeof drop);
        if (got <= 0) break;
        if (len < size - 1) len += (size_t)got;
    }
    msg[len] = '\0';
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) fail("waitpid failed");
    return status;
}

// Whether a child ended as a refusal: exit 1 and exactly one line, "error: ..." holding `want`.
static inline int is_one_line_refusal(int status, const char* msg, const char* want) {
    size_t n = strlen(msg);
    return WIFEXITED(status) && WEXITSTATUS(status) == 1 && n > 0 && strchr(msg, '\n') == msg + n - 1 &&
           strncmp(msg, "error: ", 7) == 0 && strstr(msg, want);
}

// The check `name`: body(arg) in a child is such a refusal; what it did instead is printed when not.
static inline void check_refusal(TestStats* st, const char* name, ChildBody body, const void* arg, const char* want) {
    char msg[2048];
    int status = run_in_child(body, arg, msg, sizeof msg);
    int good = is_one_line_refusal(status, msg, want);
    if (!good)
        printf("# %s: exit status %d, stderr: %s%s", name, WIFEXITED(status) ? WEXITSTATUS(status) : -1, msg,
               msg[0] && msg[strlen(msg) - 1] == '\n' ? "" : "\n");
    check_true(st, name, good);
}
