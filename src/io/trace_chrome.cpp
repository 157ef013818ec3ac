// Converts an HDF5 trace to Chrome trace-event JSON (chrome://tracing, Perfetto, speedscope).
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "stratagem/error.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/trace.hpp"

namespace stratagem::trace {
namespace {

void put_escaped(std::FILE* f, const char* s, size_t n) {
  std::fputc('"', f);
  for (size_t i = 0; i < n && s[i]; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      std::fputc('\\', f);
      std::fputc(c, f);
    } else if (c < 0x20) {
      std::fprintf(f, "\\u%04x", c);
    } else {
      std::fputc(c, f);
    }
  }
  std::fputc('"', f);
}
void put_escaped(std::FILE* f, const std::string& s) {
  put_escaped(f, s.c_str(), s.size());
}

// Microseconds with nanosecond precision.
void put_us(std::FILE* f, int64_t ns) {
  const char* sign = ns < 0 ? "-" : "";
  const int64_t a = ns < 0 ? -ns : ns;
  std::fprintf(f, "%s%" PRId64 ".%03" PRId64, sign, a / 1000, a % 1000);
}

const char* kind_name(uint8_t k) {
  return k < kNumOpKinds ? to_string(OpKind(k)) : "?";
}
const char* stream_name(uint8_t s) {
  return s < kNumStreams ? to_string(Stream(s)) : "?";
}

}  // namespace

void export_chrome(const std::string& h5_path, const std::string& json_path) {
  Reader in(h5_path);
  // Written through one checked stream: a full disk or a device at the path is an error.
  io::OutputFile out("--chrome", json_path);
  std::FILE* f = out.stream();
  {
    std::fputs("{\"displayTimeUnit\":\"ns\",\"otherData\":{", f);
    bool first = true;
    for (const char* a : {"source", "tool_version", "clock"}) {
      if (!in.has_attribute(a)) continue;
      std::fputs(first ? "" : ",", f);
      first = false;
      put_escaped(f, a);
      std::fputc(':', f);
      put_escaped(f, in.attribute(a));
    }
    std::fputs("},\n\"traceEvents\":[\n", f);
    bool any = false;
    auto sep = [&] {
      std::fputs(any ? ",\n" : "", f);
      any = true;
    };
    for (int rank : in.ranks()) {
      const std::vector<OpRecord> ops = in.ops(rank);
      sep();
      std::fprintf(f,
                   "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{"
                   "\"name\":\"rank %d\"}}",
                   rank, rank);
      sep();
      std::fprintf(f,
                   "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{"
                   "\"sort_index\":%d}}",
                   rank, rank);
      bool used[kNumStreams] = {};
      for (const OpRecord& r : ops)
        if (r.stream < kNumStreams) used[r.stream] = true;
      for (int s = 0; s < kNumStreams; ++s) {
        if (!used[s]) continue;
        sep();
        std::fprintf(f,
                     "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{"
                     "\"name\":\"%s\"}}",
                     rank, s, stream_name(uint8_t(s)));
        sep();
        std::fprintf(f,
                     "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{"
                     "\"sort_index\":%d}}",
                     rank, s, s);
      }
      for (const OpRecord& r : ops) {
        sep();
        std::fputs("{\"name\":", f);
        put_escaped(f, r.name, kNameBytes);
        std::fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":", kind_name(r.kind));
        put_us(f, r.start_ns);
        std::fputs(",\"dur\":", f);
        put_us(f, r.end_ns - r.start_ns);
        std::fprintf(f,
                     ",\"pid\":%d,\"tid\":%d,\"args\":{\"bytes\":%" PRId64
                     ",\"flops\":%.17g,\"microbatch\":%d,\"layer\":%d,\"iteration\":%d}}",
                     rank, int(r.stream), r.bytes, r.flops, r.microbatch, r.layer, r.iteration);
      }
      for (const MemorySample& m : in.memory(rank)) {
        sep();
        std::fputs("{\"name\":\"memory\",\"ph\":\"C\",\"ts\":", f);
        put_us(f, m.time_ns);
        std::fprintf(f, ",\"pid\":%d,\"tid\":0,\"args\":{", rank);
        for (int c = 0; c < kNumMemCategories; ++c)
          std::fprintf(f, "%s\"%s\":%" PRId64, c ? "," : "", to_string(MemCategory(c)), m.bytes[c]);
        std::fprintf(
            f, ",\"other\":%" PRId64 "}}", m.total_bytes - [&] {
              int64_t s = 0;
              for (int c = 0; c < kNumMemCategories; ++c) s += m.bytes[c];
              return s;
            }());
      }
    }
    std::fputs("\n]}\n", f);
  }
  out.commit();
}

}  // namespace stratagem::trace
