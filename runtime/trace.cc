#include "runtime/trace.h"

#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/json_line.h"

namespace strata {

int64_t Tracer::ThreadCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

void Tracer::Add(std::string name, const char* category, int64_t start_us, int64_t end_us, int64_t cpu_us,
                 int64_t bytes) {
  absl::MutexLock lock(&mu_);
  events_.push_back({std::move(name), category, start_us, std::max<int64_t>(end_us - start_us, 0), cpu_us, bytes});
}

size_t Tracer::size() const {
  absl::MutexLock lock(&mu_);
  return events_.size();
}

absl::Status Tracer::Write(const std::string& path) const {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("--trace ", path, ": cannot open the file for writing (", std::strerror(errno), ")"));
  absl::MutexLock lock(&mu_);
  // One event a line.
  using OrderedJson = nlohmann::ordered_json;
  out << "{\"traceEvents\": [\n";
  out << JsonLine({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", 0},
                   {"tid", rank_},
                   {"args", {{"name", absl::StrCat("rank ", rank_)}}}});
  for (const Event& e : events_) {
    OrderedJson event = {{"name", e.name},     {"cat", e.category}, {"ph", "X"},
                         {"pid", 0},          {"tid", rank_},      {"ts", e.start_us},
                         {"dur", e.duration_us}};
    if (e.cpu_us >= 0 || e.bytes >= 0) {
      OrderedJson args = OrderedJson::object();
      if (e.cpu_us >= 0) args["cpu_us"] = e.cpu_us;
      if (e.bytes >= 0) args["bytes"] = e.bytes;
      event["args"] = std::move(args);
    }
    out << ",\n" << JsonLine(event);
  }
  out << "\n]}\n";
  out.flush();
  if (!out) return absl::DataLossError(absl::StrCat("--trace ", path, ": write failed (", std::strerror(errno), ")"));
  return absl::OkStatus();
}

absl::Status MergeTraceFiles(const std::vector<std::string>& parts, const std::string& path) {
  std::string body;
  for (const auto& part : parts) {
    std::ifstream in(part);
    if (!in) return absl::NotFoundError(absl::StrCat(part, ": trace part missing"));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    // Each part is {"traceEvents": [ ... ]}: keep what lies between the brackets.
    size_t open = text.find('['), close = text.rfind(']');
    if (open == std::string::npos || close == std::string::npos || close < open) {
      return absl::DataLossError(absl::StrCat(part, ": not a trace file"));
    }
    std::string events = text.substr(open + 1, close - open - 1);
    if (events.find_first_not_of(" \n") == std::string::npos) continue;
    if (!body.empty()) body += ",";
    body += events;
  }
  std::ofstream out(path, std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("--trace ", path, ": cannot open the file for writing (", std::strerror(errno), ")"));
  out << "{\"traceEvents\": [" << body << "]}\n";
  if (!out) return absl::DataLossError(absl::StrCat("--trace ", path, ": write failed (", std::strerror(errno), ")"));
  for (const auto& part : parts) std::remove(part.c_str());
  return absl::OkStatus();
}

}  // namespace strata
