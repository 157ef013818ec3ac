// SIGTERM and SIGUSR1 during training: a request to checkpoint at the next step boundary, but
// never a way to hang a job.
// - Before the training loop (loading data, opening checkpoints: an `open` that may block on a
//   FIFO), a signal ends the process at once: there is nothing to checkpoint yet.
// - In the loop, the first signal is kept for the step boundary, where all ranks agree, save
//   and exit 0. A rank still short of the boundary `grace_s` seconds later, or given a second
//   SIGTERM, exits at once without a checkpoint (SIGUSR1 repeated is the same request: the job
//   scripts forward Slurm's TERM to the ranks as USR1, beside Slurm's own TERM).
// Exits are 128 + the signal, with one line on stderr.
#pragma once
#include <string>

namespace stratagem {

// Installs the handlers; `message_prefix` starts the exit lines ("stratagem train: on rank 3:
// "). grace_s <= 0: no bound on the way to the step boundary. quiet_before_loop: exit before
// the loop without a line (ranks of a job: a launcher ending the job signals every rank).
void install_stop_signals(double grace_s, const std::string& message_prefix,
                          bool quiet_before_loop);
// While true, a first signal is kept for the step boundary; while false, it ends the process.
void defer_stop_signals(bool in_loop);
// The signal received in the loop (SIGTERM or SIGUSR1), or 0.
int pending_stop_signal();
// The ranks agreed on stopping at a step boundary: the grace bound no longer applies (the
// checkpoint that follows is bounded by the communication watchdog).
void stop_signal_reached_boundary();

}  // namespace stratagem
