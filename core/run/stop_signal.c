// stop_signal.c: see stop_signal.h.
#include "core/run/stop_signal.h"

#include <errno.h>
#include <signal.h>
#include <string.h>

#include "base/common.h"

typedef void (*SignalHandler)(int);

static SignalHandler disposition(int sig) {
    struct sigaction cur;
    if (sigaction(sig, NULL, &cur) != 0) fail("cannot read the action of signal %d: %s", sig, strerror(errno));
    return cur.sa_handler;
}

static void on_stop_signal(int sig) {
    (void)sig;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);   // async-signal-safe since POSIX.1-2016, like sigaction
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGTERM, &dfl, NULL);   // cannot fail: valid signals, a valid action
    sigaction(SIGINT, &dfl, NULL);
}

static void catch_one(int sig) {
    if (disposition(sig) == SIG_IGN) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGTERM);   // a second signal during the handler waits for it, then ends us
    sigaddset(&sa.sa_mask, SIGINT);
    if (sigaction(sig, &sa, NULL) != 0) fail("cannot catch signal %d: %s", sig, strerror(errno));
}

void stop_signals_catch(void) {
    catch_one(SIGTERM);
    catch_one(SIGINT);
}

int stop_signal_seen(void) { return disposition(SIGTERM) == SIG_DFL || disposition(SIGINT) == SIG_DFL; }
