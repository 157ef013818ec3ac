#include "stratagem/stop_signal.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>

namespace stratagem {

namespace {
// Read and written in handlers: lock-free atomics and fixed buffers only.
volatile std::sig_atomic_t g_pending = 0;
volatile std::sig_atomic_t g_terms = 0;  // SIGTERMs received in the loop
std::atomic<bool> g_deferring{false};
unsigned g_grace_s = 0;
char g_prefix[256] = {};
bool g_quiet_before_loop = false;
char g_grace_text[128] = {};  // "no step boundary within ... s of "

void put(const char* s) {
  ssize_t ignored = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}
const char* signal_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGALRM ? "SIGALRM" : "?";
}
// The line is "<prefix><what><why>: exiting without a checkpoint".
[[noreturn]] void leave(int sig, const char* what, const char* why) {
  put(g_prefix);
  put(what);
  put(why);
  put(": exiting without a checkpoint\n");
  ::_exit(128 + (sig == SIGALRM ? SIGTERM : sig));
}

void on_stop(int sig) {
  if (!g_deferring.load()) {
    if (g_quiet_before_loop) ::_exit(128 + sig);
    leave(sig, signal_name(sig), " before the training loop (nothing to checkpoint yet)");
  }
  // Only a SIGTERM after a SIGTERM insists: Slurm's TERM and the job script's USR1 for the
  // same scancel may come in either order.
  if (sig == SIGTERM) {
    if (g_terms > 0) leave(sig, "a second SIGTERM", "");
    g_terms = 1;
  }
  if (g_pending != 0) return;  // a repeated request
  g_pending = sig;
  if (g_grace_s > 0) ::alarm(g_grace_s);
  // Said at once, so that whoever sent it knows it arrived (a second one sent before would
  // have merged with it).
  put(g_prefix);
  put(signal_name(sig));
  put(": checkpoint at the next step boundary (a second SIGTERM exits at once)\n");
}

void on_grace_over(int sig) {
  leave(sig, g_grace_text, signal_name(g_pending));
}
}  // namespace

void install_stop_signals(double grace_s, const std::string& message_prefix,
                          bool quiet_before_loop) {
  g_quiet_before_loop = quiet_before_loop;
  std::strncpy(g_prefix, message_prefix.c_str(), sizeof(g_prefix) - 1);
  g_grace_s = grace_s <= 0 ? 0 : grace_s < 1 ? 1 : unsigned(grace_s);
  std::snprintf(g_grace_text, sizeof(g_grace_text),
                "no step boundary within --signal-grace-s %u s of ", g_grace_s);
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  sa.sa_handler = on_grace_over;
  sigaction(SIGALRM, &sa, nullptr);
}

void defer_stop_signals(bool in_loop) {
  g_deferring.store(in_loop);
}

int pending_stop_signal() {
  return g_pending;
}

void stop_signal_reached_boundary() {
  ::alarm(0);
}

}  // namespace stratagem
