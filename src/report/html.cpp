#include "src/report/html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace stratagem::report::html {

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v, int decimals) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

std::string bytes(int64_t b) {
  char buf[64];
  if (std::llabs(b) >= int64_t(1) << 30)
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(int64_t(1) << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
  return buf;
}

std::string seconds(double s) {
  char buf[64];
  const double a = std::fabs(s);
  if (a >= 1 || a == 0)
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (a >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

std::string percent(double f) {
  if (!std::isfinite(f)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * f);
  return buf;
}

std::string signed_percent(double f) {
  if (!std::isfinite(f)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * f);
  return buf;
}

std::string rate(double v) {
  if (!std::isfinite(v)) return "n/a";
  const long long n = std::llround(v);
  std::string d = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return n < 0 ? "-" + out : out;
}

double nice_step(double range, int ticks) {
  if (!(range > 0)) return 1;
  const double raw = range / std::max(1, ticks);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

std::string tick(double v, double step) {
  const int decimals = step > 0 ? std::max(0, int(-std::floor(std::log10(step) + 1e-9))) : 1;
  return num(v, std::min(decimals, 9));
}

}  // namespace stratagem::report::html
