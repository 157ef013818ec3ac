// The memory section: one small stacked-area chart per pipeline stage, of the stage's
// most-loaded rank over the first iteration. Samples are bucketed to the chart's pixels keeping
// each bucket's highest sample, so the peak survives.
#include <algorithm>
#include <array>

#include "src/report/html.hpp"
#include "src/report/sections.hpp"

namespace stratagem::report {
namespace {

constexpr int kChartW = 420, kChartH = 150, kPadL = 46, kPadB = 18, kPadT = 8, kBuckets = 200;
// The categories, then the GPU process ledger (CUDA context, NCCL, cuBLAS) and fragmentation.
constexpr int kLayers = kNumMemCategories + 1;
const char* kLayerNames[kLayers] = {"weights",     "grads",   "optimizer",
                                    "activations", "buffers", "CUDA, NCCL, cuBLAS + fragmentation"};

std::array<int64_t, kLayers> layers_of(const trace::MemorySample& m) {
  std::array<int64_t, kLayers> v{};
  int64_t sum = 0;
  for (int c = 0; c < kNumMemCategories; ++c) sum += v[c] = m.bytes[c];
  v[kNumMemCategories] = std::max<int64_t>(0, m.total_bytes - sum);
  return v;
}

// Bucket b shows the highest state of its time slice: the state it starts with (the last sample
// before it) or a sample inside it. `peak`: the highest sample (nullptr: none).
struct Buckets {
  std::vector<trace::MemorySample> level;
  const trace::MemorySample* peak = nullptr;
};
Buckets bucket(const TraceData& d, const std::vector<trace::MemorySample>& samples) {
  const int64_t t0 = d.t0_ns, span = std::max<int64_t>(1, d.t1_ns - d.t0_ns);
  Buckets out;
  out.level.resize(kBuckets);
  trace::MemorySample state{};
  size_t i = 0;
  for (int b = 0; b < kBuckets; ++b) {
    const int64_t start = t0 + span * b / kBuckets;
    const int64_t end = b + 1 == kBuckets ? d.t1_ns + 1 : t0 + span * (b + 1) / kBuckets;
    while (i < samples.size() && samples[i].time_ns < start) state = samples[i++];
    out.level[b] = state;
    for (; i < samples.size() && samples[i].time_ns < end; ++i) {
      if (samples[i].total_bytes > out.level[b].total_bytes) out.level[b] = samples[i];
      if (!out.peak || samples[i].total_bytes > out.peak->total_bytes) out.peak = &samples[i];
      state = samples[i];
    }
  }
  return out;
}

// The plot's coordinates: bucket b's left edge, and the height of a byte count.
struct Scale {
  double plot_w = kChartW - kPadL - 6, plot_h = kChartH - kPadT - kPadB, ymax = 1;
  double x(int b) const { return kPadL + plot_w * b / kBuckets; }
  double y(double bytes) const { return kPadT + plot_h * (1 - bytes / ymax); }
};

// GiB ticks and their grid lines.
std::string y_axis(const Scale& sc) {
  std::string s;
  const double gib = double(int64_t(1) << 30);
  const double step = html::nice_step(sc.ymax / gib, 4);
  for (double v = 0; v * gib <= sc.ymax; v += step) {
    const double yy = sc.y(v * gib);
    s += "<line class=\"grid\" x1=\"" + html::num(kPadL, 1) + "\" x2=\"" +
         html::num(kPadL + sc.plot_w, 1) + "\" y1=\"" + html::num(yy, 1) + "\" y2=\"" +
         html::num(yy, 1) + "\"/><text class=\"tick\" x=\"" + std::to_string(kPadL - 4) +
         "\" y=\"" + html::num(yy + 3, 1) + "\" text-anchor=\"end\">" + html::tick(v, step) +
         "</text>";
  }
  return s;
}

// Stacked layers, each a closed path: its top edge left to right, the previous top back.
std::string stacked_layers(const Scale& sc, const std::vector<trace::MemorySample>& level) {
  std::vector<std::array<int64_t, kLayers>> cum(kBuckets);
  for (int b = 0; b < kBuckets; ++b) {
    cum[b] = layers_of(level[b]);
    for (int k = 1; k < kLayers; ++k) cum[b][k] += cum[b][k - 1];
  }
  std::string s;
  for (int k = 0; k < kLayers; ++k) {
    auto edge_y = [&](int b, int layer) {
      return layer < 0 ? sc.y(0) : sc.y(double(cum[b][layer]));
    };
    std::string p = "M" + html::num(sc.x(0), 1) + " " + html::num(edge_y(0, k), 1);
    double last = edge_y(0, k);
    for (int b = 0; b < kBuckets; ++b) {
      const double yy = edge_y(b, k);
      if (yy != last) p += "V" + html::num(yy, 1), last = yy;
      p += "H" + html::num(sc.x(b + 1), 1);
    }
    last = edge_y(kBuckets - 1, k - 1);
    p += "V" + html::num(last, 1);
    for (int b = kBuckets - 1; b >= 0; --b) {
      const double yy = edge_y(b, k - 1);
      if (yy != last) p += "V" + html::num(yy, 1), last = yy;
      p += "H" + html::num(sc.x(b), 1);
    }
    s += "<path class=\"m" + std::to_string(k) + "\" d=\"" + p + "Z\"/>";
  }
  return s;
}

std::string chart(const TraceData& d, int rank, const std::vector<trace::MemorySample>& samples,
                  int64_t capacity) {
  const int64_t t0 = d.t0_ns, span = std::max<int64_t>(1, d.t1_ns - d.t0_ns);
  const Buckets buckets = bucket(d, samples);
  const trace::MemorySample* peak = buckets.peak;
  // The capacity sets the scale unless it is far above the peak (then it is only named).
  const int64_t high = std::max<int64_t>(1, peak ? peak->total_bytes : 1);
  const bool capacity_shown = capacity > 0 && double(capacity) <= 1.5 * double(high);
  Scale sc;
  sc.ymax = capacity_shown ? double(std::max(capacity, high)) * 1.05 : double(high) * 1.15;
  const double plot_w = sc.plot_w;
  auto y = [&](double bytes) { return sc.y(bytes); };

  std::string s = "<svg class=\"mem-chart\" data-stage=\"" + std::to_string(d.stage_of(rank)) +
                  "\" width=\"" + std::to_string(kChartW) + "\" height=\"" +
                  std::to_string(kChartH) + "\" viewBox=\"0 0 " + std::to_string(kChartW) + " " +
                  std::to_string(kChartH) + "\">";
  s += y_axis(sc) + stacked_layers(sc, buckets.level);
  // Capacity and peak.
  if (capacity_shown)
    s += "<line class=\"capacity\" x1=\"" + std::to_string(kPadL) + "\" x2=\"" +
         html::num(kPadL + plot_w, 1) + "\" y1=\"" + html::num(y(double(capacity)), 1) +
         "\" y2=\"" + html::num(y(double(capacity)), 1) + "\"/>";
  if (capacity_shown)
    s += "<text class=\"budget-label\" x=\"" + html::num(kPadL + plot_w, 1) + "\" y=\"" +
         html::num(y(double(capacity)) - 3, 1) + "\" text-anchor=\"end\">capacity " +
         html::bytes(capacity) + "</text>";
  std::string caption;
  if (peak) {
    const double px = kPadL + plot_w * double(peak->time_ns - t0) / double(span);
    const double py = y(double(peak->total_bytes));
    s += "<circle class=\"peak\" cx=\"" + html::num(px, 1) + "\" cy=\"" + html::num(py, 1) +
         "\" r=\"3.5\"/><text class=\"peak-label\" x=\"" +
         html::num(std::min(px, kChartW - 80.0), 1) + "\" y=\"" +
         html::num(std::max(py - 6, 10.0), 1) + "\">peak " + html::bytes(peak->total_bytes) +
         "</text>";
    const auto at = layers_of(*peak);
    caption = "peak " + html::bytes(peak->total_bytes) + " at " +
              html::seconds(double(peak->time_ns - t0) * 1e-9) + ":";
    for (int k = 0; k < kLayers; ++k)
      caption += std::string(k ? "," : "") + " " + kLayerNames[k] + " " + html::bytes(at[k]);
  }
  if (capacity > 0 && !capacity_shown)
    caption += "; capacity " + html::bytes(capacity) + " (above the scale)";
  s += "<text class=\"tick\" x=\"" + std::to_string(kPadL) + "\" y=\"" +
       std::to_string(kChartH - 4) + "\">0</text><text class=\"tick\" x=\"" +
       html::num(kPadL + plot_w, 1) + "\" y=\"" + std::to_string(kChartH - 4) +
       "\" text-anchor=\"end\">" + html::seconds(double(span) * 1e-9) + "</text>";
  s += "</svg>";
  return "<figure class=\"mem\"><figcaption>stage " + std::to_string(d.stage_of(rank)) +
         " &middot; rank " + std::to_string(rank) + "</figcaption>" + s + "<p class=\"small\">" +
         html::escape(caption) + "</p></figure>";
}

}  // namespace

std::string memory_section(const TraceData& d) {
  const int64_t capacity = d.cluster ? d.cluster->gpu.hbm_bytes : 0;
  std::string h =
      "<section id=\"memory\"><h2>Memory over the iteration</h2>\n<p class=\"note\">Device bytes "
      "of the most-loaded rank of each stage (GiB), stacked by category; the dashed line is the "
      "GPU's capacity (named at the top when far above the peak), the dot the rank's "
      "peak.</p>\n<div class=\"legend\">";
  for (int k = 0; k < kLayers; ++k) h += legend_item("m" + std::to_string(k), kLayerNames[k]);
  h += "</div>\n<div class=\"grid-charts\">";
  for (size_t i = 0; i < d.memory_ranks.size(); ++i)
    h += chart(d, d.memory_ranks[i], d.memory[i], capacity);
  h += "</div></section>\n";
  return h;
}

}  // namespace stratagem::report
