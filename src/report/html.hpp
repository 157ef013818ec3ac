// Small text helpers shared by the report's sections: escaping, number formats, axis steps.
#pragma once
#include <cstdint>
#include <string>

namespace stratagem::report::html {

std::string escape(const std::string& s);  // & < > " '
std::string num(double v, int decimals);   // fixed, no trailing zeros
std::string bytes(int64_t bytes);          // "61.20 GiB", "22.5 MiB" below 1 GiB
std::string seconds(double s);             // "1.234 s", "12.3 ms", "45.6 us"
std::string percent(double fraction);      // "12.3%"
std::string signed_percent(double fraction);
std::string rate(double tokens_per_s);  // "12,345"
// A round step (1, 2, 5 x 10^k) giving about `ticks` ticks over `range`.
double nice_step(double range, int ticks);
// A tick label with as many decimals as the step needs.
std::string tick(double v, double step);

}  // namespace stratagem::report::html
