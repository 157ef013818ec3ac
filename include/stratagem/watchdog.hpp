// The training job's watchdog over blocking collective calls: the runtime's names for the
// blocking sections of stratagem/blocking_section.hpp, where the mechanism lives (below io and
// the runtime, which both guard calls with it). A section that waits longer than the job's
// communication timeout ends this process with a message naming what it waited for.
#pragma once
#include <string>
#include <utility>

#include "stratagem/blocking_section.hpp"

namespace stratagem {

using WatchdogScope = BlockingSection;
using WatchdogBound = SectionBound;

// The job's communication timeout (<= 0: off) and the prefix of the watchdog's messages.
inline void set_watchdog(double timeout_s, std::string message_prefix) {
  set_blocking_timeout(timeout_s, std::move(message_prefix));
}

}  // namespace stratagem
