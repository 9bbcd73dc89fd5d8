// What the recording tests share: an empty file to append to (the role OutputFile's temporary plays
// in cpkv replay), its lines, and a scheduled run's event log read back from its file.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpkv/sim/runner.hpp"

namespace cpkv::sim::testing {

class EmptyFile {
 public:
  explicit EmptyFile(const std::string& stem = "cpkv-recording-test") {
    const char* tmp = ::getenv("TMPDIR");
    path_ = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + stem + "-XXXXXX";
    const int fd = ::mkstemp(path_.data());
    if (fd < 0) throw std::runtime_error("mkstemp " + path_);
    ::close(fd);
  }
  ~EmptyFile() { ::unlink(path_.c_str()); }
  EmptyFile(const EmptyFile&) = delete;
  EmptyFile& operator=(const EmptyFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A scheduled run whose event log streams to a file; `log` gets its lines.
inline harness::RunReport scheduled_with_log(const harness::BatchSource& source, const harness::RunOptions& options, const Schedule& schedule,
                                             std::vector<std::string>& log, const RunLimits& limits = {}) {
  EmptyFile file("cpkv-event-log-test");
  Recording recording;
  recording.event_log_path = file.path();
  harness::RunReport report = run_scheduled(source, options, schedule, limits, recording);
  log = read_lines(file.path());
  return report;
}

}  // namespace cpkv::sim::testing
